"""The server's SampleToInsertRatio rate limiter (--samples-per-insert / --error-buffer), with real processes.

As Reverb's, the limiter measures the ratio from the minimum size on: with m = min_size_to_sample (the server's
default is 1) a SAMPLE of n may go while S + n <= (I - m) * spi + eb, an INSERT of n while
(I + n - m) * spi - S <= eb (apexrl.replay.server.rate_limiter)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apexrl.cli.server import parse_args
from apexrl.errors import ReplayTimeout, ServerTimeoutError
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.server.table_flags import TableFlags, table_from_flags
from apexrl.replay.tables import SampleToInsertRatio
from tests.helpers import wait_until

# ------------------------------------------------------------------------------ process helper (copied from
# tests/server/test_server_client.py on purpose: the test modules stay independent)


def items(n: int, tag: str = "x") -> list[bytes]:
    return [f"{tag}{i}".encode() for i in range(n)]


class Background:
    """Run fn in a thread; .result / .error / .elapsed once joined."""

    def __init__(self, fn):
        self.result = self.error = None
        self.elapsed = None
        self._t0 = time.monotonic()

        def run():
            try:
                self.result = fn()
            except BaseException as exc:  # noqa: BLE001 - inspected by the test
                self.error = exc
            self.elapsed = time.monotonic() - self._t0

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float = 8.0):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "background call did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def waiting_on_the_server(client: ReplayClient, n: int) -> dict:
    """STATS once ``n`` requests wait in the server (its ``deferred`` count): they reached it and were held,
    which a sleep on this side cannot tell from requests not sent yet."""
    return wait_until(lambda: (lambda s: s if s["deferred"] == n else None)(client.stats()), 10, f"{n} waiting")


# ------------------------------------------------------------------------------------------------ blocking


def test_a_sampler_too_far_ahead_waits_and_is_released_by_inserts(start_server):
    server = start_server("--samples-per-insert", "1", "--error-buffer", "4")
    with ReplayClient(server.endpoint, timeout=5) as client:
        client.insert(np.ones(5), items(5))  # I = 5 (m = 1): samples allowed while S + n <= (5 - 1) + 4
        assert len(client.sample(8)) == 8  # S = 8: at the bound
        with pytest.raises(ServerTimeoutError, match="rate limited"):
            client.sample(1)  # timeout 0: answered at once
        with ReplayClient(server.endpoint, timeout=5) as c2:
            waiting = Background(lambda: c2.sample(2, timeout=6))
            waiting_on_the_server(client, 1)
            assert not waiting.done()
            client.insert(np.ones(1), items(1, "a"))  # I = 6: S + 2 = 10 > 9, still blocked
            assert client.stats()["deferred"] == 1  # the loop re-examined it after the insert, before STATS
            assert not waiting.done()
            t0 = time.monotonic()
            client.insert(np.ones(1), items(1, "b"))  # I = 7: 10 <= 10, released
            assert len(waiting.join()) == 2
            assert time.monotonic() - t0 < 4.0  # released, well before its 6 s timeout
        s = client.stats()
    assert s["rate_limiter_inserted_items"] == 7 and s["rate_limiter_sampled_items"] == 10
    assert s["rate_limiter_waits_sample"] == 1 and s["rate_limiter_waits_insert"] == 0


def test_an_inserter_too_far_ahead_waits_and_is_released_by_samples(start_server):
    server = start_server("--samples-per-insert", "1", "--error-buffer", "4")
    with ReplayClient(server.endpoint, timeout=5) as client:
        client.insert(np.ones(6), items(6))  # filling up (store below min size): never limited; I = 6
        with pytest.raises(ServerTimeoutError, match="rate limited"):
            client.insert(np.ones(1), items(1, "now"))  # (6 + 1 - 1) * 1 - 0 > 4, timeout 0
        with ReplayClient(server.endpoint, timeout=5) as c2:
            waiting = Background(lambda: c2.insert(np.ones(1), items(1, "w"), timeout=6))
            waiting_on_the_server(client, 1)
            assert not waiting.done()
            client.sample(1)  # S = 1: 6 - 1 = 5 > 4, still blocked
            assert client.stats()["deferred"] == 1  # the loop re-examined it after the sample, before STATS
            assert not waiting.done()
            t0 = time.monotonic()
            client.sample(1)  # S = 2: 6 - 2 = 4 <= 4, released
            assert waiting.join().shape == (1,)
            assert time.monotonic() - t0 < 4.0  # released, well before its 6 s timeout
        s = client.stats()
    assert s["size"] == 7 and s["rate_limiter_inserted_items"] == 7 and s["rate_limiter_sampled_items"] == 2
    assert s["rate_limiter_waits_insert"] == 1 and s["rate_limiter_waits_sample"] == 0
    assert s["errors_insert"] == 1  # the timeout-0 insert


def test_waiting_requests_hold_no_worker(start_server):
    server = start_server("--samples-per-insert", "1", "--error-buffer", "2", "--workers", "1")
    with ReplayClient(server.endpoint, timeout=5) as client:
        client.insert(np.ones(2), items(2))
        client.sample(3)  # S = 3 = (2 - 1) + 2
        clients = [ReplayClient(server.endpoint, timeout=5) for _ in range(3)]
        try:
            waiting = [Background(lambda c=c: c.sample(1, timeout=6)) for c in clients]
            waiting_on_the_server(client, 3)
            assert not any(w.done() for w in waiting)
            t0 = time.monotonic()
            client.stats()  # the only worker is free
            client.insert(np.ones(3), items(3, "r"))  # I = 5: room for 3 more samples
            for w in waiting:
                assert len(w.join()) == 1
            assert time.monotonic() - t0 < 4.0  # released, well before their 6 s timeout
        finally:
            for c in clients:
                c.close()
        assert client.stats()["rate_limiter_waits_sample"] == 3


@pytest.mark.parametrize("side", ["insert", "sample"])
def test_a_blocked_request_times_out_at_its_deadline_not_before(start_server, side):
    server = start_server("--samples-per-insert", "2", "--error-buffer", "2")
    with ReplayClient(server.endpoint, timeout=5) as client:
        client.insert(np.ones(2), items(2))  # I = 2 (filling up)
        if side == "insert":  # (2 + 1 - 1) * 2 - 0 = 4 > 2
            call = lambda: client.insert(np.ones(1), items(1, "late"), timeout=0.4)  # noqa: E731
        else:
            client.sample(4)  # S = 4 = (2 - 1) * 2 + 2
            call = lambda: client.sample(1, timeout=0.4)  # noqa: E731
        t0 = time.monotonic()
        with pytest.raises(ReplayTimeout, match="rate limited") as info:
            call()
        elapsed = time.monotonic() - t0
        assert isinstance(info.value, ServerTimeoutError)
        assert 0.4 <= elapsed < 4.0  # the server's deadline, not the client's 5 s
        s = client.stats()
    assert s[f"rate_limiter_waits_{side}"] == 1 and s[f"errors_{side}"] == 1
    assert s["size"] == 2


def test_min_size_still_applies_and_filling_up_is_not_limited(start_server):
    server = start_server("--samples-per-insert", "1", "--error-buffer", "2", "--min-size-to-sample", "4")
    with ReplayClient(server.endpoint, timeout=5) as client:
        with pytest.raises(ServerTimeoutError, match="min_size_to_sample=4"):
            client.sample(1, timeout=0.2)
        with ReplayClient(server.endpoint, timeout=5) as c2:
            waiting = Background(lambda: c2.sample(2, timeout=6))
            client.insert(np.ones(3), items(3))  # size 3 < 4: not limited
            waiting_on_the_server(client, 1)  # the SAMPLE still waits for min size
            assert not waiting.done()
            client.insert(np.ones(7), items(7, "b"))  # size 3 < 4: still not limited although 10 > 2
            assert len(waiting.join()) == 2  # S = 2 <= (10 - 4) + 2
        with pytest.raises(ServerTimeoutError, match="rate limited"):
            client.insert(np.ones(1), items(1, "c"))  # at min size now: (11 - 4) - 2 > 2
        s = client.stats()
    assert s["size"] == 10 and s["rate_limiter_inserted_items"] == 10
    # waiting for min size is not a rate-limiter wait; a timeout-0 refusal did not wait (it is an error)
    assert s["rate_limiter_waits_sample"] == 0 and s["rate_limiter_waits_insert"] == 0
    assert s["errors_insert"] == 1 and s["errors_sample"] == 1


def test_concurrent_inserter_and_sampler_keep_the_ratio(start_server):
    server = start_server("--samples-per-insert", "4", "--error-buffer", "16")
    stop = threading.Event()
    counts = {"inserted": 0, "sampled": 0, "late_timeouts": 0}

    # Once one side has stopped, the other may wait on it until its call times out: only then is that fine
    # (and the server counts that TIMEOUT reply as an error).
    def inserter():
        with ReplayClient(server.endpoint, timeout=5) as c:
            while not stop.is_set():
                try:
                    c.insert(np.ones(2), items(2), timeout=3)
                except ServerTimeoutError:
                    assert stop.is_set(), "an insert waited 3 s while the sampler was still sampling"
                    counts["late_timeouts"] += 1
                    return
                counts["inserted"] += 2

    def sampler():
        with ReplayClient(server.endpoint, timeout=5) as c:
            while not stop.is_set():
                try:
                    counts["sampled"] += len(c.sample(8, timeout=3))
                except ServerTimeoutError:
                    assert stop.is_set(), "a sample waited 3 s while the inserter was still inserting"
                    counts["late_timeouts"] += 1
                    return

    threads = [Background(inserter), Background(sampler)]
    time.sleep(1.0)  # at least a second of both sides, and as long as both need to have moved (a busy machine)
    wait_until(lambda: counts["sampled"] > 50 and counts["inserted"] > 10, 30, "both sides moving")
    stop.set()
    for t in threads:
        t.join()
    with ReplayClient(server.endpoint, timeout=5) as client:
        s = client.stats()
    inserted, sampled = s["rate_limiter_inserted_items"], s["rate_limiter_sampled_items"]
    assert (inserted, sampled) == (counts["inserted"], counts["sampled"])
    assert sampled > 50 and inserted > 10  # both sides moved: no deadlock
    assert sampled <= (inserted - 1) * 4 + 16 and (inserted - 1) * 4 - sampled <= 16
    assert s["errors_total"] == counts["late_timeouts"]


# ------------------------------------------------------------------------------------------------ stats/config


def test_stats_without_and_with_the_default_buffer(start_server):
    off = start_server()
    on = start_server("--samples-per-insert", "2.5")
    with ReplayClient(off.endpoint, timeout=5) as client:
        client.insert(np.ones(3), items(3), timeout=1)  # a timeout is accepted (and unused) without a limiter
        s = client.stats()
        assert s["samples_per_insert"] == 0.0 and s["error_buffer"] == 0.0
        assert s["rate_limiter_waits_insert"] == 0 and s["rate_limiter_waits_sample"] == 0
    with ReplayClient(on.endpoint, timeout=5) as client:
        s = client.stats()
        assert s["samples_per_insert"] == 2.5 and s["error_buffer"] == 250.0
    assert off.terminate() == 0 and on.terminate() == 0


BAD_FLAGS = {
    "spi zero": (["--samples-per-insert", "0"], "must be a finite number > 0"),
    "spi negative": (["--samples-per-insert", "-1"], "must be a finite number > 0"),
    "spi nan": (["--samples-per-insert", "nan"], "must be a finite number"),
    "spi text": (["--samples-per-insert", "fast"], "is not a number"),
    "buffer negative": (["--samples-per-insert", "1", "--error-buffer", "-1"], "must be a finite number >= 0"),
    "buffer inf": (["--samples-per-insert", "1", "--error-buffer", "inf"], "must be a finite number"),
    "buffer alone": (["--error-buffer", "10"], "--error-buffer needs --samples-per-insert"),
    "buffer below 1": (
        ["--samples-per-insert", "0.5", "--error-buffer", "0.5"],
        r"must be >= max\(1, samples_per_insert\)",
    ),
    "buffer below spi": (["--samples-per-insert", "3", "--error-buffer", "2"], r"samples_per_insert\) = 3, got 2"),
}


@pytest.mark.parametrize(("flags", "reason"), BAD_FLAGS.values(), ids=BAD_FLAGS.keys())
def test_bad_rate_limiter_flags_are_rejected_with_the_reason(flags, reason, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--port", "0", *flags])
    assert info.value.code == 2
    assert re.search(reason, capsys.readouterr().err)


def test_good_rate_limiter_flags_and_the_process_rejecting_a_bad_one():
    args = parse_args(["--port", "0", "--samples-per-insert", "0.25", "--error-buffer", "1"])
    assert (args.samples_per_insert, args.error_buffer) == (0.25, 1.0)
    assert parse_args(["--port", "0"]).samples_per_insert is None
    proc = subprocess.run(
        [sys.executable, "-m", "apexrl.cli.server", "--port", "0", "--error-buffer", "5"],
        capture_output=True,
        text=True,
        timeout=8,
    )
    assert proc.returncode == 2 and "--error-buffer needs --samples-per-insert" in proc.stderr


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(error_buffer=5.0), "error_buffer needs samples_per_insert"),
        (dict(samples_per_insert=0.0), "samples_per_insert must be a finite number > 0"),
        (dict(samples_per_insert=float("inf")), "samples_per_insert must be a finite number > 0"),
        (dict(samples_per_insert=2.0, error_buffer=1.5), r"error_buffer must be >= max"),
    ],
)
def test_the_table_flags_validate_the_rate_limiter(kwargs, match):
    with pytest.raises(ValueError, match=match):
        table_from_flags(kwargs)
    assert TableFlags(samples_per_insert=3.0).rate_limiter() == SampleToInsertRatio(3.0, 1, 300.0)
    assert TableFlags(samples_per_insert=0.5).rate_limiter() == SampleToInsertRatio(0.5, 1, 100.0)
    assert TableFlags().rate_limiter() is None


# ------------------------------------------------------------------------------ the rules, without a server


def test_the_rules_in_one_place():
    from apexrl._core import NativeRateLimiter as RateLimiter

    rl = RateLimiter(spi=2.0, eb=10.0, min_size=5)
    assert not rl.big_enough(4) and rl.big_enough(5)
    assert rl.insert_ok(100, 4, 0, 0)  # filling up is never limited
    # counted from the min size on: (I + n - 5) * 2 - S <= 10 and S + n <= (I - 5) * 2 + 10
    assert rl.insert_ok(10, 5, 0, 0) and not rl.insert_ok(11, 5, 0, 0)
    assert not rl.sample_ok(1, 4, 10, 0)  # below min size
    assert rl.sample_ok(10, 5, 5, 0) and not rl.sample_ok(11, 5, 5, 0)
    assert rl.sample_ok(12, 6, 6, 0) and not rl.sample_ok(13, 6, 6, 0)
    assert rl.try_insert(10, 5) and not rl.try_insert(1, 10)
    assert rl.counts() == (10, 0)
    rl.undo(inserted=10)
    assert rl.counts() == (0, 0)
    unlimited = RateLimiter(spi=None, eb=0.0, min_size=0)
    assert unlimited.big_enough(1) and not unlimited.big_enough(0)
    assert unlimited.insert_ok(10**6, 10, 0, 0) and unlimited.sample_ok(10**6, 1, 0, 0)
    assert rl.describe() == "0 items inserted and 0 sampled, samples_per_insert=2, error_buffer=10"


def test_filling_up_to_the_min_size_gives_the_learner_no_head_start():
    """Reverb's offset: the ratio counts from min_size_to_sample on, so a learner that starts at 50 000 items
    (apex-dpg-control: spi 1.57, error buffer 2560) may sample one error buffer ahead of the ratio, not m x spi (78 571) more."""
    from apexrl._core import NativeRateLimiter as RateLimiter

    spi, eb, m = 22_000 / 14_000, 2560.0, 50_000
    rl = RateLimiter(spi=spi, eb=eb, min_size=m)
    assert rl.try_insert(m, 0)  # the fill-up: never limited
    assert rl.sample_ok(2560, m, m, 0) and not rl.sample_ok(2561, m, m, 0)
    assert rl.try_sample(2560, m) and not rl.try_sample(1, m)
    assert rl.try_insert(1, m) and rl.try_sample(1, m)  # each insert then allows spi samples
    # inserts may run ahead of the ratio by the error buffer only: (m + 1 + k - m) * spi - 2561 <= 2560
    k = int((2 * eb + 1) / spi) - 1
    assert rl.insert_ok(k, m + 1, m + 1, 2561) and not rl.insert_ok(k + 1, m + 1, m + 1, 2561)


@pytest.mark.parametrize(
    "n, m, ok",
    [
        (150, 0, True),
        (200, 0, True),
        (201, 0, False),
        (0, 200, True),
        (0, 201, False),
        (100, 100, True),
        (256, 50, False),
    ],
)
def test_one_deadlock_rule_for_the_run_plan_and_the_server(n, m, ok):
    from apexrl._core import NativeRateLimiter as RateLimiter
    from apexrl._core import serve_deadlock_reason
    from apexrl.replay.server.rate_limiter import deadlock_reason
    from apexrl.replay.wire.schema import Op

    reason = deadlock_reason(n, m, 1.0, 100.0)
    assert (reason is None) == ok
    assert serve_deadlock_reason(n, m, 1.0, 100.0) == reason  # the native copy of the arithmetic agrees
    if not ok:
        assert "exceeds 2 x error_buffer = 200" in reason and "samples_per_insert=1, error_buffer=100" in reason
    rl = RateLimiter(spi=1.0, eb=100.0, min_size=1)
    assert rl.try_insert(101, 0)  # (I - min size) * spi - S = 100 = error_buffer, store at min size
    if m == 0:
        assert (rl.never_admitted(int(Op.SAMPLE), n, 100) is None) == ok
    if n == 0:
        assert (rl.never_admitted(int(Op.INSERT), m, 100) is None) == ok
        assert rl.never_admitted(int(Op.INSERT), m, 0) is None  # filling up is never limited


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 5000), m=st.integers(0, 5000), spi=st.floats(0.01, 64), eb=st.floats(1, 4000))
def test_the_native_deadlock_arithmetic_is_the_run_plans(n, m, spi, eb):
    """The server's native copy of deadlock_reason gives the run plan's answers, message included."""
    from apexrl._core import serve_deadlock_reason
    from apexrl.replay.server.rate_limiter import deadlock_reason

    assert serve_deadlock_reason(n, m, spi, eb) == deadlock_reason(n, m, spi, eb)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 300),
    size=st.integers(0, 400),
    inserted=st.integers(0, 2000),
    sampled=st.integers(0, 4000),
    spi=st.floats(0.05, 40),
    eb=st.floats(1, 500),
    m=st.integers(0, 300),
)
def test_the_native_rules_are_the_documented_ones(n, size, inserted, sampled, spi, eb, m):
    """apexrl.replay.server.rate_limiter's docstring states the rules with Reverb's min-size offset; the native limiter
    applies exactly those."""
    from apexrl._core import NativeRateLimiter as RateLimiter

    eb = max(eb, spi)
    need = max(m, 1)
    rl = RateLimiter(spi=spi, eb=eb, min_size=m)
    eps = 1e-9
    insert_ok = n == 0 or size < need or (inserted + n - need) * spi - sampled <= eb + eps
    sample_ok = size >= need and sampled + n <= (inserted - need) * spi + eb + eps
    assert rl.insert_ok(n, size, inserted, sampled) == insert_ok
    assert rl.sample_ok(n, size, inserted, sampled) == sample_ok
