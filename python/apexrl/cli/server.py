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

from apexrl.cli.args import ENDPOINT_RE, LOG_LEVEL, add_curve_arguments, given_flags, refuse_beside_plan
from apexrl.cli.flags import Flag, add_flags, values
from apexrl.replay.server.config import ServerConfig, check_snapshot_dir
from apexrl.replay.server.table_flags import TABLE_FLAGS, TableFlags, table_from_flags
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
  capacity           soft capacity in items (default 1000000): remove_to_fit evicts down to it
                     (Reverb's max_size=N is capacity=N with max_size=N)
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


TABLE_FLAG_DECLS = (
    Flag(TableFlags, "capacity", "soft capacity in items: remove_to_fit evicts down to it"),
    Flag(
        TableFlags,
        "max_size",
        "hard ceiling in items (>= capacity): inserts beyond it evict down to capacity even if no learner calls "
        "REMOVE_TO_FIT",
        metavar="ITEMS",
        none="2 * capacity",
    ),
    Flag(TableFlags, "alpha", "priority exponent alpha of sampling"),
    Flag(
        TableFlags,
        "eviction",
        "which items remove_to_fit takes when the store is over --capacity: "
        f"{kind_names(REMOVERS, REMOVER_ALIASES, '')}; fifo / lifo: oldest / newest first, "
        "prioritized: drawn with probability proportional to priority^--alpha-evict, uniform: drawn, every item "
        "alike, lowest_priority / max_heap: lowest / highest priorities first",
        metavar="{" + ",".join(REMOVERS) + "}",
    ),
    Flag(TableFlags, "alpha_evict", "exponent of prioritized eviction"),
    Flag(TableFlags, "min_size_to_sample", "SAMPLE waits (up to its timeout) until the store holds this many items"),
    Flag(
        TableFlags,
        "samples_per_insert",
        "rate-limit to SPI sampled items per inserted item, Reverb-style",
        metavar="SPI",
        none="off",
    ),
    Flag(
        TableFlags,
        "error_buffer",
        "allowed drift from SPI in sampled items (>= max(1, SPI))",
        metavar="ITEMS",
        none="max(1, SPI) * 100",
    ),
    Flag(
        TableFlags,
        "spec",
        "the run's TransitionSpec (its JSON, or a JSON file): every insert is checked against it",
        metavar="JSON|PATH",
        none="the spec the first inserter declares",
    ),
    Flag(
        TableFlags,
        "storage",
        "memory, or disk: every insert, priority update, erase, eviction and queue pop is logged under "
        "--storage-path before it is acknowledged, and a restarted server reopens the table with its items, "
        "priorities and keys (items without chunks only)",
    ),
    Flag(
        TableFlags,
        "storage_path",
        "a disk table's directory (created if missing, its parent must exist; a LOCK file keeps a second server out)",
        metavar="DIR",
        none="none (needed with --storage disk)",
    ),
    Flag(
        TableFlags,
        "durability",
        "a disk table's: sync holds each reply that acknowledges a change until an fdatasync covers it (nothing "
        "acknowledged is lost on a power cut; the server serves others meanwhile); interval fdatasyncs within "
        "10 ms after the reply (a power cut may lose the last 10 ms; a killed process loses nothing)",
        none="sync",
    ),
    Flag(
        TableFlags,
        "cache_bytes",
        "a disk table's: the log's newest bytes also kept in memory, so a SAMPLE copies the items it finds there "
        "instead of reading each from the file (0: none; the server's memory grows by up to this much); set it "
        "to at least the table's bytes: a batch with one item outside it is read from the files",
        metavar="BYTES",
        none="1073741824 (1 GiB)",
    ),
)
"""The table flags (:data:`~apexrl.replay.server.table_flags.TABLE_FLAGS`): the table ``default``."""

SERVER_FLAG_DECLS = (
    Flag(ServerConfig, "bind", "address to bind (0.0.0.0 = all)"),
    Flag(ServerConfig, "shards", "number of lock shards of the store"),
    Flag(ServerConfig, "seed", "random seed of the store"),
    Flag(
        ServerConfig,
        "snapshot",
        "snapshot file: loaded at start if present, written on shutdown (its directory must exist and be "
        "writable; PATH.epoch beside it records the key epoch of each life)",
        metavar="PATH",
        none="no snapshot",
    ),
    Flag(
        ServerConfig,
        "snapshot_every",
        "also write the snapshot every SECONDS (needs --snapshot)",
        metavar="SECONDS",
        none="only on shutdown",
    ),
    Flag(ServerConfig, "max_message_mb", "largest accepted request in MiB (bigger: TOO_LARGE reply or disconnect)"),
    Flag(ServerConfig, "workers", "native worker threads for large samples, REMOVE_TO_FIT and ERASE"),
    Flag(
        ServerConfig,
        "inline_sample_max",
        "samples of at most N items are served by the native loop's own thread, larger ones by the workers",
        metavar="N",
    ),
    Flag(
        ServerConfig,
        "max_wait_s",
        "longest a request waits on the server (a larger timeout_ms is clipped)",
        option="--max-wait",
        metavar="SECONDS",
    ),
    Flag(
        ServerConfig,
        "max_waiting",
        "most requests waiting at once, all peers together (more: TIMEOUT at once)",
        metavar="N",
    ),
    Flag(
        ServerConfig,
        "max_waiting_per_peer",
        "most waiting requests of one peer; one more and its oldest is answered TIMEOUT",
        metavar="N",
    ),
    Flag(ServerConfig, "max_waiting_mb", "most MiB held by waiting inserts (more: TIMEOUT at once)", metavar="MIB"),
    Flag(
        ServerConfig,
        "max_reply_mb",
        "largest SAMPLE reply in MiB, estimated before sampling (TOO_LARGE)",
        metavar="MIB",
        none="--max-message-mb",
    ),
    Flag(
        ServerConfig,
        "max_unread_mb",
        "most MiB of replies one client may leave unread in the server; a SAMPLE over it is refused TIMEOUT",
        metavar="MIB",
    ),
    Flag(
        ServerConfig,
        "handshake_s",
        "close connections that have not completed the ZeroMQ handshake by then (0: never)",
        option="--handshake-timeout",
        metavar="SECONDS",
    ),
    Flag(
        ServerConfig,
        "heartbeat_s",
        "ping peers this often, close a connection silent 3x as long (0: off)",
        option="--heartbeat",
        metavar="SECONDS",
    ),
)
"""The flags of ServerConfig's server-wide fields but --port (which --endpoint may replace)."""


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
    port = Flag(
        ServerConfig,
        "port",
        "TCP port to listen on (0 = pick a free one; the first stdout line, "
        f"'{PROG} listening on tcp://HOST:PORT', names it)",
    )
    port.add(p, default=None, shown="required unless --endpoint")
    p.add_argument("--endpoint", type=_endpoint, help="tcp://HOST:PORT to listen on (instead of --bind/--port)")
    p.add_argument(
        "--tables",
        metavar="FILE",
        default=None,
        help="the server's tables from a JSON file (format below); without it the table flags configure the "
        "one table 'default'",
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
    add_flags(p, SERVER_FLAG_DECLS)
    add_flags(p.add_argument_group("the table 'default' (without --tables)"), TABLE_FLAG_DECLS)
    LOG_LEVEL.add(p)
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
        tables = [table_from_flags(values(args, TABLE_FLAG_DECLS))]
    return ServerConfig(
        **values(args, SERVER_FLAG_DECLS),
        port=args.port,
        drop_tables=tuple(args.drop_tables),
        curve_dir=args.curve_dir,
        insecure=args.insecure,
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
