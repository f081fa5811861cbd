"""``apexrl-replay-server``: run a replay server until SIGTERM / SIGINT (then snapshot and exit 0).

Also runnable as ``python -m apexrl.cli.server``. Prints ``apexrl-replay-server listening on ENDPOINT`` on
stdout (flushed) once it accepts requests.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from apexrl.cli.args import (
    ENDPOINT_RE,
    add_curve_arguments,
    field_arg,
    given_flags,
    refuse_beside_plan,
)
from apexrl.replay.server.config import MAX_SHARDS, ServerConfig, check_snapshot_dir
from apexrl.replay.server.table_flags import EVICTION_POLICIES, TABLE_FLAGS, TableFlags, table_from_flags
from apexrl.replay.tables import REMOVER_ALIASES, REMOVERS, SAMPLER_ALIASES, SAMPLERS, TableConfig


def kind_names(names: Sequence[str], aliases: dict[str, str], default: str) -> str:
    """``a (default), b (alias c), ...``: the store's kind names as the help lists them."""
    alias_of = {name: alias for alias, name in aliases.items()}
    return ", ".join(
        name + (" (default)" if name == default else "") + (f" (alias {alias_of[name]})" if name in alias_of else "")
        for name in names
    )


PROG = "apexrl-replay-server"

TABLES_HELP = f"""\
tables (--tables FILE): a JSON list of tables, each an object with the fields of
apexrl.replay.TableConfig; a field left out takes its default, "name" is required:
  name               unique per server, 1-64 characters of [A-Za-z0-9_.-]
  sampler            {kind_names(SAMPLERS, SAMPLER_ALIASES, TableConfig.sampler)}
                     (prioritized: p^alpha with IS weights; the heaps: by priority)
  remover            what goes when over capacity (prioritized: drawn by p^alpha_evict):
                     {kind_names(REMOVERS, REMOVER_ALIASES, TableConfig.remover)}
  capacity           soft capacity in items (default 1000000; Reverb's max_size)
  max_size           hard ceiling (>= capacity; default null: 2 * capacity)
  alpha, alpha_evict priority exponents of sampling and of eviction (0.6, -0.4)
  max_times_sampled  an item goes after its k-th draw (default 0: no limit)
  rate_limiter       null (default: min size 1), {{"kind": "min_size", "min_size": N}},
                     {{"kind": "sample_to_insert_ratio", "samples_per_insert": X,
                      "min_size_to_sample": N, "error_buffer": E}}, {{"kind": "queue", "size": N}}
  spec               the items' TransitionSpec: its JSON object, or a file path (relative
                     to FILE); default null: the first inserter's
example:
  [{{"name": "default", "capacity": 1000000}},
   {{"name": "aux", "sampler": "uniform", "capacity": 100000}},
   {{"name": "onpolicy", "sampler": "fifo", "capacity": 1024, "max_times_sampled": 1,
    "rate_limiter": {{"kind": "queue", "size": 1024}}}}]
Without --tables, the table flags (--capacity, --max-size, --alpha, --eviction, --alpha-evict,
--min-size-to-sample, --samples-per-insert, --error-buffer, --spec) configure the one table
"default"; they cannot be given beside --tables. docs/running.md, "Tables".
"""


def _endpoint(text: str) -> tuple[str, int]:
    m = ENDPOINT_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not of the form tcp://HOST:PORT")
    host, port = m.group(1).strip("[]"), int(m.group(2))
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range, must be in [0, 65535]")
    if host == "*":
        host = "0.0.0.0"
    return host, port


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Ape-X prioritized replay server (ZeroMQ). SIGTERM/SIGINT: finish requests, snapshot, exit 0.",
        epilog=TABLES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--plan",
        metavar="PLAN_JSON",
        default=None,
        help="take every setting from a run plan written by `apexrl run` (then only --log-level may be "
        "given besides, and --index)",
    )
    p.add_argument(
        "--index",
        metavar="I",
        type=int,
        default=None,
        help="with --plan: run the plan's replay server I (0-based; default 0) when it has several",
    )
    p.add_argument("--port", type=field_arg(ServerConfig, "port"), help="TCP port to listen on (0 = pick a free one)")
    p.add_argument("--endpoint", type=_endpoint, help="tcp://HOST:PORT to listen on (instead of --bind/--port)")
    p.add_argument("--bind", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 = all)")
    p.add_argument(
        "--tables",
        metavar="FILE",
        default=None,
        help="the server's tables from a JSON file (format below); without it the table flags configure the "
        "one table 'default'",
    )
    p.add_argument(
        "--capacity", type=field_arg(TableFlags, "capacity"), default=1_000_000, help="soft capacity in items (>= 1)"
    )
    p.add_argument(
        "--max-size",
        metavar="ITEMS",
        type=field_arg(TableFlags, "max_size"),
        default=None,
        help="hard ceiling in items (>= capacity; default 2 * capacity): inserts beyond it evict down to "
        "capacity even if no learner calls REMOVE_TO_FIT",
    )
    p.add_argument("--alpha", type=field_arg(TableFlags, "alpha"), default=0.6, help="priority exponent alpha (>= 0)")
    p.add_argument(
        "--eviction",
        choices=EVICTION_POLICIES,
        default=TableFlags.eviction,
        metavar="{" + ",".join(REMOVERS) + "}",
        help="which items remove_to_fit takes when the store is over --capacity: "
        f"{kind_names(REMOVERS, REMOVER_ALIASES, TableFlags.eviction)}; fifo / lifo: oldest / newest first, "
        "prioritized: drawn with probability proportional to priority^--alpha-evict, uniform: drawn, every item "
        "alike, lowest_priority / max_heap: lowest / highest priorities first",
    )
    p.add_argument(
        "--alpha-evict",
        type=field_arg(TableFlags, "alpha_evict"),
        default=-0.4,
        help="exponent of prioritized eviction",
    )
    p.add_argument(
        "--shards",
        type=field_arg(ServerConfig, "shards"),
        default=8,
        help=f"number of lock shards of the store (1-{MAX_SHARDS})",
    )
    p.add_argument("--seed", type=field_arg(ServerConfig, "seed"), default=0, help="random seed of the store")
    p.add_argument(
        "--min-size-to-sample",
        type=field_arg(TableFlags, "min_size_to_sample"),
        default=1,
        help="SAMPLE waits (up to its timeout) until the store holds this many items",
    )
    p.add_argument(
        "--snapshot",
        metavar="PATH",
        default=None,
        help="snapshot file: loaded at start if present, written on shutdown (its directory must exist "
        "and be writable; PATH.epoch beside it records the key epoch of each life)",
    )
    p.add_argument(
        "--drop-tables",
        metavar="NAME",
        nargs="+",
        action="extend",
        default=[],
        help="tables the snapshot holds that the configuration leaves out, to delete on purpose (without it, a "
        "snapshot table that is not configured stops the server at start, its items kept)",
    )
    p.add_argument(
        "--snapshot-every",
        metavar="SECONDS",
        type=field_arg(ServerConfig, "snapshot_every"),
        default=None,
        help="also write the snapshot every SECONDS (needs --snapshot)",
    )
    p.add_argument(
        "--max-message-mb",
        type=field_arg(ServerConfig, "max_message_mb"),
        default=256,
        help="largest accepted request in MiB (bigger: TOO_LARGE reply or disconnect)",
    )
    p.add_argument(
        "--workers",
        type=field_arg(ServerConfig, "workers"),
        default=2,
        help="native worker threads for large samples, REMOVE_TO_FIT and ERASE (default 2)",
    )
    p.add_argument(
        "--inline-sample-max",
        metavar="N",
        type=field_arg(ServerConfig, "inline_sample_max"),
        default=1024,
        help="samples of at most N items are served by the native loop's own thread, larger ones by the "
        "workers (default 1024)",
    )
    p.add_argument(
        "--samples-per-insert",
        metavar="SPI",
        type=field_arg(TableFlags, "samples_per_insert"),
        default=None,
        help="rate-limit to SPI sampled items per inserted item, Reverb-style (> 0; default: off)",
    )
    p.add_argument(
        "--error-buffer",
        metavar="ITEMS",
        type=field_arg(TableFlags, "error_buffer"),
        default=None,
        help="allowed drift from SPI in sampled items (>= max(1, SPI); default max(1, SPI) * 100)",
    )
    p.add_argument(
        "--spec",
        metavar="JSON|PATH",
        default=None,
        help="the run's TransitionSpec (its JSON, or a JSON file): every insert is checked against it "
        "(default: the spec the first inserter declares)",
    )
    p.add_argument(
        "--max-wait",
        metavar="SECONDS",
        dest="max_wait_s",
        type=field_arg(ServerConfig, "max_wait_s"),
        default=60.0,
        help="longest a request waits on the server (a larger timeout_ms is clipped; default 60)",
    )
    p.add_argument(
        "--max-waiting",
        metavar="N",
        type=field_arg(ServerConfig, "max_waiting"),
        default=16384,
        help="most requests waiting at once, all peers together (more: TIMEOUT at once; default 16384)",
    )
    p.add_argument(
        "--max-waiting-per-peer",
        metavar="N",
        type=field_arg(ServerConfig, "max_waiting_per_peer"),
        default=1024,
        help="most waiting requests of one peer; one more and its oldest is answered TIMEOUT (default 1024)",
    )
    p.add_argument(
        "--max-waiting-mb",
        metavar="MIB",
        type=field_arg(ServerConfig, "max_waiting_mb"),
        default=256,
        help="most MiB held by waiting inserts (more: TIMEOUT at once; default 256)",
    )
    p.add_argument(
        "--max-reply-mb",
        metavar="MIB",
        type=field_arg(ServerConfig, "max_reply_mb"),
        default=None,
        help="largest SAMPLE reply in MiB, estimated before sampling (TOO_LARGE; default --max-message-mb)",
    )
    p.add_argument(
        "--max-unread-mb",
        metavar="MIB",
        type=field_arg(ServerConfig, "max_unread_mb"),
        default=256,
        help="most MiB of replies one client may leave unread in the server; a SAMPLE over it is "
        "refused TIMEOUT (default 256)",
    )
    p.add_argument(
        "--handshake-timeout",
        metavar="SECONDS",
        dest="handshake_s",
        type=field_arg(ServerConfig, "handshake_s"),
        default=5.0,
        help="close connections that have not completed the ZeroMQ handshake by then (0: never; default 5)",
    )
    p.add_argument(
        "--heartbeat",
        metavar="SECONDS",
        dest="heartbeat_s",
        type=field_arg(ServerConfig, "heartbeat_s"),
        default=10.0,
        help="ping peers this often, close a connection silent 3x as long (0: off; default 10)",
    )
    p.add_argument(
        "--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="logging level (stderr)"
    )
    add_curve_arguments(p, binds=True)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parsed flags with ``args.config``, the validated :class:`ServerConfig` (exit 2 with the reason on a bad
    flag or combination)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.plan is not None:
        from apexrl.launch.plan import server_config_from_plan

        refuse_beside_plan(parser, argv, "index")
        try:
            args.config = server_config_from_plan(args.plan, args.index or 0)
            if args.config.snapshot is not None:
                check_snapshot_dir(args.config.snapshot)
        except (OSError, ValueError) as e:
            parser.error(f"--plan: {e}")
        return args
    if args.index is not None:
        parser.error("--index selects a server of --plan; give --plan too")
    if args.endpoint is not None:
        if args.port is not None:
            parser.error("--endpoint and --port are mutually exclusive")
        args.bind, args.port = args.endpoint
    elif args.port is None:
        parser.error("--port is required (or give --endpoint)")
    if args.snapshot_every is not None and args.snapshot is None:
        parser.error("--snapshot-every needs --snapshot")
    if args.tables is not None:
        from apexrl.replay.tables import load_tables

        given = given_flags(parser, sys.argv[1:] if argv is None else argv)
        clash = [flag for dest, flag in TABLE_FLAGS.items() if dest in given]
        if clash:
            parser.error(
                f"--tables sets every table: leave out {', '.join(clash)} (the flags of the one table 'default' "
                "without --tables); give those settings in the tables file"
            )
        try:
            args.tables = load_tables(args.tables)
        except ValueError as e:
            parser.error(f"--tables {e}")
    if args.error_buffer is not None and args.samples_per_insert is None:
        parser.error("--error-buffer needs --samples-per-insert")
    try:
        args.config = config_from_args(args)
        if args.snapshot is not None:
            check_snapshot_dir(args.snapshot)
    except ValueError as e:
        parser.error(str(e))
    return args


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The :class:`ServerConfig` of parsed flags (ValueError from its validation)."""
    tables = args.tables
    if tables is None:
        tables = [table_from_flags({name: getattr(args, name) for name in TABLE_FLAGS})]
    return ServerConfig(
        bind=args.bind,
        port=args.port,
        shards=args.shards,
        seed=args.seed,
        snapshot=args.snapshot,
        drop_tables=tuple(args.drop_tables),
        snapshot_every=args.snapshot_every,
        max_message_mb=args.max_message_mb,
        workers=args.workers,
        inline_sample_max=args.inline_sample_max,
        curve_dir=args.curve_dir,
        insecure=args.insecure,
        max_wait_s=args.max_wait_s,
        max_waiting=args.max_waiting,
        max_waiting_per_peer=args.max_waiting_per_peer,
        max_waiting_mb=args.max_waiting_mb,
        max_reply_mb=args.max_reply_mb,
        max_unread_mb=args.max_unread_mb,
        handshake_s=args.handshake_s,
        heartbeat_s=args.heartbeat_s,
        tables=tables,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return serve(args.config, args.log_level)


def serve(config: ServerConfig, log_level: str = "INFO") -> int:
    """Run a replay server until SIGTERM/SIGINT; the exit status (1 if it cannot start)."""
    logging.basicConfig(level=log_level, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from apexrl.replay.server import ReplayServer, SnapshotLoadError, SnapshotSaveError

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger("apexrl.replay.server").info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    from apexrl.security import raise_nofile_limit, warn_if_exposed

    raise_nofile_limit(PROG)
    warn_if_exposed(config.bind, config.curve_dir, PROG)
    try:
        server = ReplayServer(config)
        server.start()
    except (SnapshotLoadError, ValueError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # noqa: BLE001 - zmq.ZMQError (address in use, bad bind address), NativeLoopError, ...
        print(f"{PROG}: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"{PROG} listening on {server.endpoint}", flush=True)
    status = 0
    try:
        while not stop.wait(0.5):
            if server.failed.is_set():  # e.g. its ZAP handler died: refuse to go on serving
                print(f"{PROG}: error: {server.failure}", file=sys.stderr, flush=True)
                status = 1
                break
    finally:
        try:
            server.stop()
        except SnapshotSaveError as exc:  # said plainly: a traceback would add nothing
            logging.getLogger("apexrl.replay.server").error("%s", exc)
            print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
            return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
