"""The local launcher: the replay server(s), one learner and N actors as supervised child processes.

:class:`Launcher` takes a :class:`~apexrl.launch.plan.RunPlan`, places it on 127.0.0.1 (free ports), writes the
placed plan to ``RUN_DIR/plan.json`` and starts ``apexrl-replay-server``, ``apexrl-learner`` and the actors
(``python -m apexrl.cli.* --plan RUN_DIR/plan.json``) with their output in ``RUN_DIR/logs/NAME.log``. It
prints live progress from the children's JSON records (``RUN_DIR/logs/NAME.progress.jsonl``,
:mod:`apexrl.launch.progress`) and stops everything at the end.

Supervision. Any child that exits while the run is going on is restarted with the same flags, on
the same ports, after a back-off (1 s, doubling per exit within the last minute, at most 30 s): an actor as it
was, the replay server from its latest snapshot in the run directory (``--snapshot-every``; without snapshots
it starts empty, the actors refill it), the learner
with ``--resume`` (it continues from its last checkpoint and serves weights on the same port, so the actors
follow it). A child that exits more than ``max_restarts_per_minute`` times within 60 s is crash-looping, and
an exit with status 2 is a usage error that a restart cannot fix: either stops the run with a message naming
the log and exit status 1. A learner exiting 0 by itself (``--steps`` reached) ends the run normally; an actor
exiting 0 by itself (an ``--max-steps`` in its flags) is done and stays down.

Shutdown (end of ``--minutes``/``--steps``, SIGINT or SIGTERM): SIGTERM to the actors (they insert what they
hold), then to the learner (it checkpoints), then to the server, waiting for each with a timeout and SIGKILL
for stragglers. Children run in their own process groups, so a terminal's Ctrl-C reaches only the launcher,
which then stops them in that order; a second SIGINT/SIGTERM SIGKILLs every child at once (exit status 130).
On Linux each child also gets SIGTERM if the launcher itself dies (``PR_SET_PDEATHSIG``), so not even a
``kill -9`` of the launcher leaves processes behind (all stop at once then, unordered: each hands over what it
can within a 2 s grace and exits, see :mod:`apexrl.apex.stopping`).

Single-threaded: signal handlers only set flags or send signals; the loop in :meth:`Launcher.run` does the rest.
:meth:`Launcher.run` may run off the main thread (``apexrl.run`` in a notebook or a sweep script): it installs no
signal handlers there, and another thread ends the run with :meth:`Launcher.stop`.

The loop runs over :class:`SupervisedChild`; :meth:`Launcher._place` decides where the children run (here:
:class:`Child`, a local subprocess). :mod:`apexrl.launch.ray_launcher` places them on a Ray cluster instead,
with the same loop.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from apexrl.durable import make_private_dirs, write_atomically
from apexrl.launch.orphans import die_with_parent
from apexrl.launch.plan import PLAN_NAME, RunPlan
from apexrl.launch.progress import LogTail, Progress, RecordTail, format_duration

if TYPE_CHECKING:
    from apexrl.tensorboard import RunMirror

FINAL_EVAL_NAME = "final_eval.json"
"""What ``apexrl evaluate --json`` writes at the end of a run that reached its length."""

__all__ = ["Child", "ChildSpec", "Launcher", "PlacementError", "SupervisedChild", "free_ports", "server_name"]

RESTART_WINDOW_S = 60.0
MAX_BACKOFF_S = 30.0
STOP_TIMEOUTS_S = {"actor": 20.0, "learner": 90.0, "server": 30.0}  # the learner writes a checkpoint
SERVER_START_TIMEOUT_S = 60.0


class PlacementError(Exception):
    """The run cannot be placed (the message says why and what to do); nothing was started."""


def free_ports(n: int, host: str = "127.0.0.1", base: int = 0) -> list[int]:
    """``n`` distinct TCP ports on ``host`` that were free a moment ago (all sockets held open together, so no
    repeats): any free ones, or with ``base`` exactly ``base .. base + n - 1`` (PlacementError naming the one
    that is taken)."""
    socks = []
    try:
        for i in range(n):
            s = socket.socket()
            socks.append(s)
            try:
                s.bind((host, base + i if base else 0))
            except OSError as e:
                raise PlacementError(
                    f"port {base + i} on {host} is not free ({e.strerror}): --ports {base} takes "
                    f"{base}-{base + n - 1} (the replay servers', then the learner's parameter "
                    "service)"
                ) from None
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True)
class ChildSpec:
    """How to start one child: ``python -m MODULE ARGS``; ``restart_args`` replace ``args`` on a restart."""

    name: str
    """server, learner, actor0, actor1, ... (also the log file's name)."""
    role: str
    """server, learner or actor: decides the shutdown order and timeout."""
    module: str
    args: list[str]
    restart_args: list[str] | None = None
    progress_path: str | None = None
    """Where the child appends its JSON progress records (None: it writes none)."""


class SupervisedChild:
    """What :class:`Launcher`'s loop needs of one child, wherever its process runs: start, poll, signals, and
    the restart bookkeeping (exit times, back-off). :class:`Child` runs it here as a subprocess; the Ray
    launcher's child runs it inside a Ray actor on some node (:mod:`apexrl.launch.ray_launcher`)."""

    def __init__(self, spec: ChildSpec, log_path: str):
        self.spec = spec
        self.log_path = log_path
        self.starts = 0
        self.exit_times: collections.deque[float] = collections.deque()
        self.restart_at: float | None = None  # set while waiting out a back-off
        self.finished = False  # exited 0 by itself: done, not restarted

    @property
    def restarts(self) -> int:
        return max(self.starts - 1, 0)

    def start(self) -> None:
        """Start the process (``spec.restart_args`` from the second start on)."""
        raise NotImplementedError

    def poll(self) -> int | None:
        """The exit status once the process has exited (negative: killed by that signal), else None."""
        raise NotImplementedError

    @property
    def running(self) -> bool:
        raise NotImplementedError

    def send(self, sig: int) -> None:
        """Signal the process's group; must be safe to call from a signal handler."""
        raise NotImplementedError

    def wait(self) -> None:
        """After a SIGKILL: until the process is gone."""
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        """The running process's pid (on its own machine), or None."""
        raise NotImplementedError

    @property
    def node(self) -> str | None:
        """The machine the process runs on, where that is not this one."""
        return None

    @property
    def where(self) -> str:
        """The process in messages: ``pid 1234``."""
        return f"pid {self.pid}"

    def pump(self) -> bool:
        """Bring the process's new output into its local log and progress files (a local child writes them
        itself); True when the process's pid became known since the last call (a local one's is at once)."""
        return False

    def describe_exit(self, code: int) -> str:
        return describe_exit(code)

    def record_exit(self, now: float) -> int:
        """Note an exit; returns the exits within the last RESTART_WINDOW_S seconds."""
        self.exit_times.append(now)
        while self.exit_times and self.exit_times[0] < now - RESTART_WINDOW_S:
            self.exit_times.popleft()
        return len(self.exit_times)


class Child(SupervisedChild):
    """One supervised local subprocess, in its own process group."""

    def __init__(self, spec: ChildSpec, log_path: str, env: dict[str, str], python: str):
        super().__init__(spec, log_path)
        self.env = env
        self.python = python
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        args = self.spec.restart_args if self.starts and self.spec.restart_args is not None else self.spec.args
        with open(self.log_path, "ab") as log:
            if self.starts:
                log.write(f"=== apexrl run: restart {self.starts} at {time.strftime('%H:%M:%S')} ===\n".encode())
                log.flush()
            self.proc = subprocess.Popen(
                [self.python, "-m", self.spec.module, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.starts += 1
        self.restart_at = None

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, sig: int) -> None:
        if self.running:
            try:
                os.killpg(self.proc.pid, sig)  # type: ignore[union-attr]
            except ProcessLookupError:
                pass

    def wait(self) -> None:
        if self.proc is not None:
            self.proc.wait()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid


def server_name(index: int, count: int) -> str:
    """A replay server child's name (and log file): ``server`` when there is one, else ``server0``, ..."""
    return "server" if count == 1 else f"server{index}"


def child_specs(placed: RunPlan, plan_path: str, server_log_level: str) -> list[ChildSpec]:
    """How to start each child of a placed plan saved at ``plan_path``: the one place where a plan becomes
    processes. The servers come first, then the learner, then the actors."""
    n = len(placed.servers)
    specs = [
        ChildSpec(
            server_name(i, n),
            "server",
            "apexrl.cli.server",
            ["--plan", plan_path, "--index", str(i), "--log-level", server_log_level],
        )
        for i in range(n)
    ]
    learner = ["--plan", plan_path]
    specs.append(
        ChildSpec(
            "learner",
            "learner",
            "apexrl.cli.learner",
            learner,
            restart_args=learner + ["--resume"],
            progress_path=placed.learner.progress_path,
        )
    )
    for actor in placed.actors:
        specs.append(
            ChildSpec(
                f"actor{actor.index}",
                "actor",
                "apexrl.cli.actor",
                ["--plan", plan_path, "--index", str(actor.index)],
                progress_path=actor.progress_path,
            )
        )
    if placed.run.offline is not None:  # in place of actors: fills the replay from the dataset, then exits 0
        specs.append(ChildSpec("loader", "actor", "apexrl.cli.loader", ["--plan", plan_path]))
    return specs


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def log_tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


class Launcher:
    """Runs one local Ape-X system until its limits or a signal; :meth:`run` returns the exit status."""

    def __init__(
        self,
        plan: RunPlan,
        *,
        server_log_level: str = "WARNING",
        python: str = sys.executable,
        out: TextIO | None = None,
        tensorboard: str | None = None,
    ):
        self.plan = plan
        self.tensorboard = tensorboard
        """Directory of the TensorBoard event file mirroring metrics.csv and episodes.csv (None: none)."""
        self._board: RunMirror | None = None  # while running with --tensorboard
        self.config = plan.run
        self.run_dir = plan.run.run_dir
        self.log_dir = os.path.join(self.run_dir, "logs")
        self.server_log_level = server_log_level
        self.python = python
        self.out = out or sys.stdout
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.progress = Progress(len(plan.actors))
        self.children: list[SupervisedChild] = []
        self.server_endpoints: list[str] = []  # set by _place
        self.params_endpoint = ""
        self.tails: dict[str, RecordTail] = {}  # each child's progress records
        self._stop_reason: str | None = None
        self._reached_end = False  # stopped by --minutes/--steps (not a signal or an error): final evaluation
        self._exit_code = 0
        self._signals = 0
        self._status_shown = False  # a TTY status line is on screen (without newline)
        self.final_eval: dict | None = None
        """RUN_DIR/final_eval.json as the final evaluation wrote it (None: none ran or it failed)."""

    def stop(self, reason: str = "stop requested") -> None:
        """Ask a running :meth:`run` (on another thread) to stop cleanly, as SIGINT would; no final evaluation."""
        if self._stop_reason is None:
            self._stop_reason = reason

    # ------------------------------------------------------------------------------------------ output

    def _print(self, text: str) -> None:
        """A permanent line (clears a TTY status line first)."""
        if self._status_shown:
            self.out.write("\r\033[K")
            self._status_shown = False
        self.out.write(text + "\n")
        self.out.flush()

    def _status(self, text: str, commit: bool) -> None:
        if self.config.quiet:
            return
        if self.tty and not commit:
            # A line wider than the terminal would wrap, and "\r" would then redraw only its last part.
            width = shutil.get_terminal_size().columns - 1
            self.out.write("\r\033[K" + text[:width])
            self.out.flush()
            self._status_shown = True
        else:
            self._print(text)

    # ------------------------------------------------------------------------------------------ children

    def _place(self) -> list[SupervisedChild]:
        """The children of this run, servers first, placed on this machine (127.0.0.1, free ports)."""
        *server_ports, params_port = free_ports(len(self.plan.servers) + 1, base=self.plan.run.port_base)
        self.server_endpoints = [f"tcp://127.0.0.1:{port}" for port in server_ports]
        self.params_endpoint = f"tcp://127.0.0.1:{params_port}"
        placed = self.plan.placed(
            replay=self.server_endpoints,
            server_port=server_ports,
            params=self.params_endpoint,
            params_port=params_port,
            logs=self.log_dir,
        )
        path = os.path.join(self.run_dir, PLAN_NAME)
        placed.save(path)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        return [
            Child(spec, os.path.join(self.log_dir, f"{spec.name}.log"), env, self.python)
            for spec in child_specs(placed, path, self.server_log_level)
        ]

    def _await_started(self, children: list[SupervisedChild]) -> None:
        """Before the start-up lines name them: until the children's processes run (they do locally)."""

    def _close(self) -> None:
        """After the shutdown: release what the placement holds (nothing locally)."""

    def _pump(self) -> None:
        started = [child for child in self.children if child.pump()]  # every child pumped
        for child in started:
            if child.restarts:  # placed after its restart was announced (a Ray child)
                self._print(f"{child.spec.name} runs again ({child.where})")
        if started:
            self._write_pids()

    def _start(self, child: SupervisedChild) -> None:
        child.start()
        self._write_pids()

    def _write_pids(self) -> None:
        """RUN_DIR/pids.json: the launcher's and every running child's pid (for tools and tests), and for
        children on other machines their node."""
        running = [c for c in self.children if c.pid is not None and c.running]
        pids: dict = {"launcher": os.getpid(), "children": {c.spec.name: c.pid for c in running}}
        nodes = {c.spec.name: c.node for c in running if c.node is not None}
        if nodes:
            pids["nodes"] = nodes
        write_atomically(os.path.join(self.run_dir, "pids.json"), json.dumps(pids))

    def _wait_for_servers(self, servers: list[SupervisedChild], tails: list[LogTail]) -> SupervisedChild | None:
        """Until every server's log says it listens (its one fixed start-up line); the first that exits or
        stays silent is returned (None: all listen)."""
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        waiting = dict(zip([s.spec.name for s in servers], zip(servers, tails)))
        while waiting and time.monotonic() < deadline and self._stop_reason is None:
            self._pump()
            for name, (server, tail) in list(waiting.items()):
                if any("listening on" in line for line in tail.read()):
                    del waiting[name]
                elif server.poll() is not None:
                    return server
            time.sleep(0.1)
        return next(iter(waiting.values()))[0] if waiting else None

    # ------------------------------------------------------------------------------------------ run

    def run(self) -> int:
        make_private_dirs(self.log_dir)  # and the run directory: 0700 when created here
        if self.tensorboard is not None:
            from apexrl.tensorboard import RunMirror

            try:
                self._board = RunMirror(self.tensorboard, self.run_dir)
            except OSError as e:
                self._print(f"apexrl run: error: --tensorboard {self.tensorboard}: {e}")
                self._exit_code = 2
                return self._exit_code
        # Python allows signal handlers only on the main thread; elsewhere the caller stops the run with stop().
        on_main = threading.current_thread() is threading.main_thread()
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if on_main else {}
        start = time.monotonic()
        try:
            try:
                self.children = self._place()
            except PlacementError as e:
                self._print(f"apexrl run: error: {e}")
                self._exit_code = 2
                return self._exit_code
            for child in self.children:
                path = child.spec.progress_path
                if path is not None:
                    self.tails[child.spec.name] = RecordTail(path)
                    self.tails[child.spec.name].skip_to_end()  # an earlier run's records (--resume) are not this run's
            k = len(self.server_endpoints)
            servers, rest = self.children[:k], self.children[k:]
            server_logs = [LogTail(server.log_path) for server in servers]
            for server, tail in zip(servers, server_logs):
                tail.skip_to_end()
                self._start(server)
            failed = self._wait_for_servers(servers, server_logs)
            if failed is not None or self._stop_reason is not None:
                if self._stop_reason is None:
                    assert failed is not None
                    self._fail(
                        f"replay server {failed.spec.name} did not start; {failed.log_path}:\n"
                        f"{log_tail(failed.log_path)}"
                    )
            else:
                for endpoint, server in zip(self.server_endpoints, servers):
                    self._print(f"replay server {endpoint} ({server.where})")
                for child in rest:
                    self._start(child)
                self._await_started(rest)
                self._print(
                    f"learner ({rest[0].where}) serving weights on {self.params_endpoint}; "
                    + ", ".join(f"{c.spec.name} ({c.where})" for c in rest[1:])
                )
                if self.plan.server.curve_dir is not None:
                    self._print(f"CURVE on both services (keys in {self.plan.server.curve_dir})")
                self._print(f"logs in {self.log_dir}")
                self._supervise(start)
        finally:
            try:
                self._shutdown()
            finally:
                self._close()
                for s, h in previous.items():
                    signal.signal(s, h)
                if self._board is not None:  # the rows the stopped processes wrote last
                    self._board.close()
        elapsed = time.monotonic() - start
        self._summary(elapsed)
        if self._reached_end and self._exit_code == 0 and self.config.final_eval_episodes > 0:
            self._final_evaluation(self.config.final_eval_episodes)
        return self._exit_code

    def _final_evaluation(self, episodes: int) -> None:
        """``apexrl evaluate`` of the final checkpoint into RUN_DIR/final_eval.json (the evaluation protocol's
        closing evaluation). Its failure or a Ctrl-C is reported and leaves the run's exit status alone: the run
        itself finished and its checkpoint is there to evaluate again."""
        out = os.path.join(self.run_dir, FINAL_EVAL_NAME)
        log_path = os.path.join(self.log_dir, "final_eval.log")
        cmd = [self.python, "-m", "apexrl", "evaluate", self.run_dir, "--episodes", str(episodes), "--json", out]
        self._print(f"final evaluation: {episodes} episodes of the last checkpoint (Ctrl-C skips it)")
        try:
            with open(log_path, "ab") as log:
                done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
        except KeyboardInterrupt:
            self._print(
                "final evaluation skipped (interrupted); run it later with: "
                f"apexrl evaluate {self.run_dir} --episodes {episodes}"
            )
            return
        if done.returncode != 0:
            self._print(f"final evaluation failed (exit status {done.returncode}); {log_path}:\n{log_tail(log_path)}")
            return
        try:
            with open(out, encoding="utf-8") as f:
                result = json.load(f)
            self._print(
                f"final evaluation: return {result['mean']:.1f} ± {result['se']:.1f} (SE) over "
                f"{result['episodes']} episodes at learner step {result['learner_steps']}"
                f"{' (Polyak-averaged weights)' if result.get('eval_weights') == 'polyak' else ''} -> {out}"
            )
            self.final_eval = result
        except (OSError, ValueError, KeyError, TypeError) as e:
            self._print(f"final evaluation wrote no readable {out}: {e}")

    def _supervise(self, start: float) -> None:
        cfg = self.config
        limit_s = cfg.minutes * 60.0 if cfg.minutes else None
        next_status = time.monotonic() + cfg.progress_every
        while self._stop_reason is None:
            now = time.monotonic()
            new_eval = False
            self._pump()
            for name, tail in self.tails.items():
                new_eval |= self.progress.feed(name, tail.records())
            if self._board is not None:
                self._board.poll()
            for child in self.children:
                self._check(child, now)
                if self._stop_reason is not None:
                    return
            if limit_s is not None and now - start >= limit_s:
                self._stop_reason = f"reached --minutes {cfg.minutes:g}"
                self._reached_end = True
            elif new_eval or now >= next_status:
                self._status(self.progress.line(now - start, limit_s, cfg.steps or None), commit=new_eval)
                next_status = now + cfg.progress_every
            time.sleep(0.2)

    def _check(self, child: SupervisedChild, now: float) -> None:
        """Restart a child that exited, after its back-off; stop the run where a restart cannot help."""
        if child.finished:
            return
        if child.restart_at is not None:
            if now >= child.restart_at:
                self._start(child)
                self.progress.restarts += 1
                self._print(f"{child.spec.name} restarted ({child.where}, restart {child.restarts})")
            return
        code = child.poll()
        if code is None:
            return
        name = child.spec.name
        if code == 0 and child.spec.role == "learner":  # it stops by itself only at --max-steps/--max-minutes
            self._stop_reason = f"reached --steps {self.config.steps}" if self.config.steps else "the learner finished"
            self._reached_end = True
            return
        if code == 0 and child.spec.role == "actor":  # finished its --max-steps (given in --actor-args)
            child.finished = True
            self._print(f"{name} finished (exit status 0); not restarted")
            return
        recent = child.record_exit(now)
        if code == 2:
            self._fail(
                f"{name} refused its flags ({child.describe_exit(code)}); {child.log_path}:\n{log_tail(child.log_path)}"
            )
        elif recent > self.config.max_restarts_per_minute:
            self._fail(
                f"{name} exited {recent} times within {RESTART_WINDOW_S:.0f} s ({child.describe_exit(code)}): "
                f"giving up; {child.log_path}:\n{log_tail(child.log_path)}"
            )
        else:
            backoff = min(2.0 ** (recent - 1), MAX_BACKOFF_S)
            child.restart_at = now + backoff
            self._print(f"{name} exited unexpectedly ({child.describe_exit(code)}); restarting in {backoff:.0f} s")

    def _fail(self, message: str) -> None:
        self._print(f"apexrl run: error: {message.rstrip()}")
        self._stop_reason = "error"
        self._exit_code = 1

    # ------------------------------------------------------------------------------------------ stopping

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals += 1
        if self._signals == 1:
            self._stop_reason = f"received {signal.Signals(signum).name}"
            return
        for child in self.children:  # second signal: no more waiting
            child.send(signal.SIGKILL)
        self._exit_code = 130

    def _shutdown(self) -> None:
        if self._stop_reason and self._stop_reason != "error":
            self._print(f"stopping: {self._stop_reason}")
        for role in ("actor", "learner", "server"):
            group = [c for c in self.children if c.spec.role == role]
            for child in group:
                child.restart_at = None  # one waiting out a back-off stays down
            group = [c for c in group if c.running]
            for child in group:
                child.send(signal.SIGTERM)
            self._wait_all(group, STOP_TIMEOUTS_S[role])
        self._write_pids()

    def _wait_all(self, group: list[SupervisedChild], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._pump()
            if not any(c.running for c in group) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        for child in group:
            if child.running:
                self._print(f"{child.spec.name} did not stop within {timeout:.0f} s: SIGKILL")
                child.send(signal.SIGKILL)
            child.wait()
            code = child.poll()
            # A child still importing when SIGTERM came dies of it with nothing to lose; any other non-zero
            # status means it did not finish its clean stop (flush, checkpoint, snapshot).
            if code not in (None, 0, -signal.SIGKILL, -signal.SIGTERM) and self._exit_code == 0:
                self._print(f"{child.spec.name} stopped with {child.describe_exit(code)}; see {child.log_path}")

    def _summary(self, elapsed: float) -> None:
        self._pump()
        for name, tail in self.tails.items():
            self.progress.feed(name, tail.records())
        p = self.progress
        ev = f", last eval return {p.eval_return:.1f}" if p.eval_return is not None else ""
        self._print(
            f"run finished after {format_duration(elapsed)}: {p.learner_steps} learner steps{ev}, {p.restarts} restarts"
        )
        self._print(f"run directory: {self.run_dir}")
        best = best_line(self.run_dir)
        if best is not None:
            self._print(best)
        self._print(f"plot it:       apexrl plot {self.run_dir}")


def best_line(run_dir: str) -> str | None:
    """The closing line on the run's best periodic evaluation and its checkpoint (None: the run has none)."""
    from apexrl.rundir import BEST_CHECKPOINT, RunDirError, best_eval

    try:
        best = best_eval(run_dir)
    except RunDirError as e:
        return f"best checkpoint unreadable: {e}"
    if best is None:
        return None
    return (
        f"best periodic evaluation: return {best['mean']:.1f} over {best.get('episodes')} episodes at learner step "
        f"{best.get('learner_steps')} (the highest of the run's: optimistic) -> {BEST_CHECKPOINT}; score it: "
        f"apexrl evaluate {run_dir} --best"
    )
