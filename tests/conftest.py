"""Shared fixtures: real apexrl processes on 127.0.0.1.

`start_server(*flags, port=0, preexec_fn=None)` starts `python -m apexrl.cli.server` with the flags (and
`preexec_fn` run in the child before it starts, e.g. to set resource limits), waits for its
"listening on" line and returns a ServerProc. At teardown every server still running is killed, and the
test fails if any server logged a traceback or an ERROR line.

`spawn(name, module, *args)` starts any apexrl command (actor, learner, launcher) with its output in a log
file, returns a Proc (`wait_for(regex)`, `terminate()`, `kill9()`); all are killed at teardown.
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
import zmq
from hypothesis import settings

# Under CI every hypothesis test draws the same examples on every run (derandomize): a landing is never failed by a
# generator's rare corner that the previous landing did not meet. Locally (no CI variable) examples stay random, so
# development keeps exploring; a failure prints its seed (--hypothesis-seed=N) to reproduce it.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

START_TIMEOUT = 20.0
E2E_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e")


def pytest_collection_modifyitems(config, items):
    """Every test under tests/e2e/ (the whole system as several real processes) carries the ``e2e`` marker:
    ``pytest -m "not e2e"`` leaves them out, ``pytest -m e2e`` runs only them.

    The long tests run first (``slow``, then ``e2e``; otherwise in collection order): pytest-xdist hands tests out
    in this order, so its workers start the long ones early and end together on short ones, rather than one
    worker finishing a minute-long test while the other has nothing left.

    Tests of one ``xdist_group`` (a module whose tests share one run, in file order) move together, as early as
    their longest member and in file order: with ``--dist loadgroup`` (.ci/run) one worker runs them as a unit."""
    for item in items:
        if os.path.commonpath([str(item.path), E2E_DIR]) == E2E_DIR:
            item.add_marker(pytest.mark.e2e)

    def length(item) -> tuple[bool, bool]:
        return item.get_closest_marker("slow") is None, item.get_closest_marker("e2e") is None

    def group(item) -> str | None:
        mark = item.get_closest_marker("xdist_group")
        return (mark.kwargs.get("name") or mark.args[0]) if mark is not None else None

    groups: dict[str, tuple[bool, bool]] = {}
    for item in items:
        if (name := group(item)) is not None:
            groups[name] = min(groups.get(name, (True, True)), length(item))
    items.sort(key=lambda item: groups[name] if (name := group(item)) is not None else length(item))


class ServerProc:
    def __init__(self, proc: subprocess.Popen, endpoint: str, log_path: str):
        self.proc = proc
        self.endpoint = endpoint
        self.log_path = log_path

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def terminate(self, timeout: float = 20.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS line")

    def kill9(self) -> None:
        """SIGKILL, as a crash would (no snapshot, no cleanup)."""
        self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()


@pytest.fixture
def start_server(tmp_path):
    procs: list[subprocess.Popen] = []
    logs: list[str] = []
    counter = [0]

    def start(*args: str, port: int = 0, preexec_fn: Callable[[], None] | None = None) -> ServerProc:
        counter[0] += 1
        log_path = str(tmp_path / f"server{counter[0]}.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "apexrl.cli.server", "--port", str(port), "--log-level", "WARNING", *args],
                stdout=subprocess.PIPE,
                stderr=log,
                preexec_fn=preexec_fn,  # a test's resource limits (RLIMIT_FSIZE), set in the child
            )
        procs.append(proc)
        logs.append(log_path)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT)
        line = proc.stdout.readline().decode() if ready else ""
        proc.stdout.close()
        if "listening on" not in line:
            proc.kill()
            proc.wait(10)
            with open(log_path, encoding="utf-8", errors="replace") as f:
                raise AssertionError(f"server did not start: {line!r}\n{f.read()}")
        return ServerProc(proc, line.strip().rsplit(" ", 1)[1], log_path)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stdout is not None and not proc.stdout.closed:
            proc.stdout.close()
    for path in logs:  # no server ever logged an unexpected exception
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        assert "Traceback" not in text and " ERROR " not in text, text


@pytest.fixture
def raw_socket():
    """make(endpoint) -> a raw zmq DEALER connected to it, for sending hand-made (hostile) messages."""
    ctx = zmq.Context()
    socks: list[zmq.Socket] = []

    def make(endpoint: str) -> zmq.Socket:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        socks.append(s)
        return s

    yield make
    for s in socks:
        s.close(linger=0)
    ctx.term()


class Proc:
    """A real apexrl process (`python -m MODULE ARGS`) with its stdout+stderr in a log file."""

    def __init__(self, name: str, proc: subprocess.Popen, log_path: str):
        self.name = name
        self.proc = proc
        self.log_path = log_path

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def wait_for(self, pattern: str, timeout: float = 60.0, start: int = 0) -> re.Match:
        """Wait until the log (from character ``start``) matches the regex; fail with the log if it doesn't."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while True:
            m = rx.search(self.log(), start)
            if m:
                return m
            if self.proc.poll() is not None or time.monotonic() > deadline:
                m = rx.search(self.log(), start)
                if m:
                    return m
                state = f"exited {self.proc.returncode}" if self.proc.poll() is not None else "timed out"
                raise AssertionError(f"{self.name}: {state} waiting for {pattern!r}; log:\n{self.log()[-4000:]}")
            time.sleep(0.2)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def spawn(tmp_path):
    """spawn(name, module, *args, env=, preexec_fn=) -> Proc; every process still running at teardown is killed."""
    procs: list[Proc] = []

    def start(name: str, module: str, *args: str, env: dict | None = None, preexec_fn=None) -> Proc:
        log_path = str(tmp_path / f"{name}.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-u", "-m", module, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                preexec_fn=preexec_fn,
            )
        p = Proc(name, proc, log_path)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill9()


def free_port() -> int:
    """A TCP port that was free a moment ago (for servers that must be restarted on the same port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
