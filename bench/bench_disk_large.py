"""A table on disk larger than memory: filled, sampled with the page cache cold and warm, the server's RSS, and
the time to reopen it after kill -9.

One replay server (this tree's, ``python -m apexrl.cli.server``) whose table ``default`` is on disk
(``--storage disk --durability interval``) under --dir, filled over loopback with --bytes of items of
--item-bytes each (random bytes; default 28,224: one 4 x 84 x 84 uint8 Atari frame stack) by one client, --batch
items a request. Then, each figure printed as it is measured:

1. fill: items/s and MB/s of the fill, the server's RSS (VmRSS) after it and per item, and stats()'s bytes held
   per item (16: where the item lies in the log);
2. cold: the page cache of the table's files dropped (``posix_fadvise(POSIX_FADV_DONTNEED)`` on each segment,
   which drops the clean pages of a file, from any process; the interval syncer has made them clean), then one
   client sampling --sample-batch items a request for --seconds: items/s and MB/s;
3. warm: every segment read once (``POSIX_FADV_WILLNEED``, then a sequential read; in a table larger than
   memory only the part that fits stays), then the same sampling for --seconds;
4. reopen: the server killed (SIGKILL), the page cache of its files dropped again (a machine that lost power
   starts cold), and a new server started on the same directory: seconds until it listens (its log replayed:
   every record read and checked), and its item count against what was acknowledged.

--bytes defaults to the lesser of 1.5x this machine's memory (MemTotal) and 80 % of the free space at --dir:
check ``df`` first on a shared machine and pass a smaller --bytes there. Figures go to stdout (and --json).

    python bench/bench_disk_large.py --dir /data/bench --bytes 36e9     # the issue's 1.5x-memory table
    python bench/bench_disk_large.py --bytes 2e9 --seconds 10           # a small trial
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import mmap
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_wire as W  # noqa: E402 - the wire bench's harness (its Server, rss_of), from this folder


def mem_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def default_bytes(directory: str) -> int:
    return int(min(1.5 * mem_total(), 0.8 * shutil.disk_usage(directory).free))


def segments(table_dir: str) -> list[str]:
    return sorted(os.path.join(table_dir, n) for n in os.listdir(table_dir) if n.startswith("seg-"))


def drop_cache(table_dir: str) -> None:
    """Drops the page cache of every file of the table (clean pages only: the caller made sure they were synced)."""
    for name in os.listdir(table_dir):
        try:
            fd = os.open(os.path.join(table_dir, name), os.O_RDONLY)
        except FileNotFoundError:  # a compaction's temporary, or a segment it deleted
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_fraction(table_dir: str) -> float:
    """The fraction of the segments' pages in the page cache (mincore(2) over a read-only mapping of each)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = os.sysconf("SC_PAGE_SIZE")
    resident = total = 0
    for path in segments(table_dir):
        try:
            size = os.path.getsize(path)
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # deleted by a compaction meanwhile
            continue
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap {path}")
            pages = (size + page - 1) // page
            vec = ctypes.create_string_buffer(pages)
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            resident += sum(b & 1 for b in vec.raw)
            total += pages
            libc.munmap(ctypes.c_void_p(addr), size)
        finally:
            os.close(fd)
    return resident / max(1, total)


def warm_cache(table_dir: str) -> None:
    for path in segments(table_dir):
        with contextlib.suppress(FileNotFoundError), open(path, "rb", buffering=0) as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
            while f.read(8 << 20):
                pass


def sample_for(endpoint: str, n: int, seconds: float) -> dict[str, float]:
    from apexrl.replay import ReplayClient

    items = nbytes = 0
    with ReplayClient(endpoint, timeout=120) as c:
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < seconds:
            batch = c.sample(n)
            items += len(batch)
            nbytes += int(batch.offsets[-1])
    return {"items_per_s": items / elapsed, "mb_per_s": nbytes / elapsed / 1e6}


def sampling_phase(
    name: str, prepare: Callable[[str], None], table_dir: str, endpoint: str, n: int, seconds: float
) -> dict[str, float]:
    """``prepare`` the page cache (drop_cache or warm_cache), then sample for ``seconds``: the figures, printed."""
    prepare(table_dir)
    before = resident_fraction(table_dir)
    rates = sample_for(endpoint, n, seconds)
    after = resident_fraction(table_dir)
    print(
        f"{name} ({before:.1%} of the log in the page cache before, {after:.1%} after): "
        f"{rates['items_per_s']:,.0f} items/s sampled, {rates['mb_per_s']:,.0f} MB/s",
        flush=True,
    )
    return {
        f"{name}_resident_before": before,
        f"{name}_resident_after": after,
        **{f"{name}_{k}": v for k, v in rates.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=None, help="where the table's log goes (default: beside this file, on its disk)")
    p.add_argument("--bytes", type=float, default=None, help="item bytes to fill (default: see above)")
    p.add_argument("--item-bytes", type=int, default=4 * 84 * 84, help="bytes per item (default 28224)")
    p.add_argument("--batch", type=int, default=32, help="items per INSERT request (default 32)")
    p.add_argument("--sample-batch", type=int, default=32, help="items per SAMPLE request (default 32)")
    p.add_argument("--seconds", type=float, default=20.0, help="each sampling phase's length (default 20)")
    p.add_argument("--shards", type=int, default=8, help="the server's --shards (default 8)")
    p.add_argument(
        "--cache-bytes",
        type=int,
        default=None,
        help="the table's --cache-bytes, its log tail kept in memory (default: the server's, 1 GiB)",
    )
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args()
    from apexrl.replay import ReplayClient

    base = args.dir or HERE
    total = int(args.bytes) if args.bytes is not None else default_bytes(base)
    n_items = max(1, total // args.item_bytes)
    out: dict[str, float | int | str] = {"item_bytes": args.item_bytes, "items": n_items, "bytes": total}
    print(
        f"table of {n_items:,} items of {args.item_bytes:,} bytes ({total / 1e9:.2f} GB; memory "
        f"{mem_total() / 1e9:.1f} GB)",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench_disk_large_", dir=base) as tmp:
        table_dir = os.path.join(tmp, "table")
        flags = [
            "--storage",
            "disk",
            "--storage-path",
            table_dir,
            "--durability",
            "interval",
            "--shards",
            str(args.shards),
        ] + ([] if args.cache_bytes is None else ["--cache-bytes", str(args.cache_bytes)])
        capacity = n_items + 1
        server = W.Server(capacity, flags)
        try:
            rss_empty = W.rss_of(server.pid)
            rng = np.random.default_rng(0)
            block = rng.integers(0, 256, size=args.item_bytes * args.batch + 4096, dtype=np.uint8)
            offsets = np.arange(args.batch + 1, dtype=np.uint64) * np.uint64(args.item_bytes)
            start = time.monotonic()
            done = 0
            with ReplayClient(server.endpoint, timeout=120) as c:
                while done < n_items:
                    m = min(args.batch, n_items - done)
                    shift = int(rng.integers(0, 4096))
                    c.insert(
                        rng.uniform(0.1, 2.0, m),
                        data=block[shift : shift + m * args.item_bytes],
                        offsets=offsets[: m + 1],
                    )
                    done += m
                fill_s = time.monotonic() - start
                stats = c.stats()
                # Every write fdatasynced (clean pages, which the kernel may drop) before the cache is dropped.
                deadline = time.monotonic() + 60
                while c.stats()["table.default.disk_unsynced_writes"] != 0 and time.monotonic() < deadline:
                    time.sleep(0.01)
            rss = W.rss_of(server.pid)
            out.update(
                fill_items_per_s=n_items / fill_s,
                fill_mb_per_s=n_items * args.item_bytes / fill_s / 1e6,
                rss_empty_bytes=rss_empty,
                rss_bytes=rss,
                rss_growth_per_item=(rss - rss_empty) / n_items,
                bytes_held_per_item=float(stats["bytes_held"]) / max(1, int(stats["size"])),
            )
            print(
                f"fill: {out['fill_items_per_s']:,.0f} items/s, {out['fill_mb_per_s']:,.0f} MB/s; server RSS "
                f"{rss_empty / 1e6:,.0f} MB empty, {rss / 1e6:,.0f} MB full ({out['rss_growth_per_item']:,.0f} "
                f"bytes an item; bytes held an item {out['bytes_held_per_item']:.0f})",
                flush=True,
            )
            for phase, prepare in (("cold", drop_cache), ("warm", warm_cache)):
                out.update(sampling_phase(phase, prepare, table_dir, server.endpoint, args.sample_batch, args.seconds))
            out["rss_after_sampling_bytes"] = W.rss_of(server.pid)
            server.proc.kill()
            server.proc.wait()
        finally:
            server.close()
        drop_cache(table_dir)
        out["reopen_resident_before"] = resident_fraction(table_dir)
        start = time.monotonic()
        server = W.Server(capacity, flags)
        try:
            out["reopen_s"] = time.monotonic() - start
            with ReplayClient(server.endpoint, timeout=120) as c:
                out["reopened_items"] = int(c.stats()["size"])
            out["rss_after_reopen_bytes"] = W.rss_of(server.pid)
        finally:
            server.close()
        print(
            f"reopen after kill -9 ({out['reopen_resident_before']:.1%} in the page cache): {out['reopen_s']:.1f} s to "
            f"listen (the process's start included), "
            f"{out['reopened_items']:,} of {n_items:,} items; RSS {out['rss_after_reopen_bytes'] / 1e6:,.0f} MB",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
