"""``apexrl.run(...)``: ``apexrl run`` from Python (a notebook, a sweep script), with keyword arguments named like
its flags.

Each keyword becomes the flag of the same name (``envs_per_actor=4`` is ``--envs-per-actor 4``; ``True`` gives a
switch such as ``resume``, ``False`` or ``None`` leaves a flag out; the ``*_args`` pass-through flags take a string
or a list of strings; ``agent_set`` takes a mapping, ``agent_set={"num_samples": 40}``, or a list of
``"NAME=VALUE"`` strings), and the command line's own parser, run plan and validation check them: a bad value raises
ValueError with the reason ``apexrl run`` would print. The call then launches the run, waits for it (printing
the progress lines unless ``quiet=True``) and returns a :class:`RunResult`.

It works off the main thread: there it installs no signal handlers, and ``stop`` (a :class:`threading.Event`)
ends the run early and cleanly, as Ctrl-C does for the command. The child processes die with the calling thread
(``PR_SET_PDEATHSIG``), which waits in this call until they have stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = ["RunResult", "run"]


@dataclass(frozen=True)
class RunResult:
    """What ``apexrl.run`` returns."""

    run_dir: str
    """The run directory (metrics.csv, episodes.csv, checkpoint, logs/)."""
    exit_status: int
    """``apexrl run``'s exit status: 0 a clean end (limits reached or stopped on request), 1 a failed run."""
    final_eval: dict[str, Any] | None
    """RUN_DIR/final_eval.json (``mean``, ``se``, ``returns``, ...) when the run reached its --minutes/--steps and
    the final evaluation ran (``final_eval`` episodes > 0); None otherwise."""


def _flags() -> dict[str, argparse.Action]:
    """``apexrl run``'s options by keyword name."""
    from apexrl.launch.start import fill_run_parser

    parser = fill_run_parser(argparse.ArgumentParser(add_help=False))
    return {a.dest: a for a in parser._actions if a.option_strings}


def to_argv(kwargs: dict[str, Any]) -> list[str]:
    """The ``apexrl run`` command line of ``kwargs``; TypeError naming an unknown keyword."""
    flags = _flags()
    argv: list[str] = []
    for name, value in kwargs.items():
        action = flags.get(name)
        if action is None:
            raise TypeError(f"apexrl.run() got an unexpected keyword argument {name!r}; valid: {', '.join(flags)}")
        option = action.option_strings[-1]
        if value is None or value is False:
            continue
        if action.nargs == 0:  # a switch
            if value is not True:
                raise TypeError(f"apexrl.run({name}=...) takes True or False, got {value!r}")
            argv.append(option)
        elif name.endswith("_args") and not isinstance(value, str) and isinstance(value, Sequence):
            argv.append(f"{option}={shlex.join(map(str, value))}")
        elif isinstance(action, argparse._AppendAction) and isinstance(value, Mapping):  # agent_set={"k": v}
            argv += [f"{option}={k}={json.dumps(list(v) if isinstance(v, tuple) else v)}" for k, v in value.items()]
        elif isinstance(action, argparse._AppendAction) and isinstance(value, Sequence) and not isinstance(value, str):
            argv += [f"{option}={v}" for v in value]
        else:
            argv.append(f"{option}={value}")
    return argv


def run(*, stop: threading.Event | None = None, out: TextIO | None = None, **kwargs: Any) -> RunResult:
    """Plan, launch and wait for an Ape-X run on this machine, as ``apexrl run`` with these flags does.

    ``stop``: set it (from any thread) to stop the run early and cleanly. ``out``: where the progress lines go
    (default stdout). Raises ValueError on a bad flag, setting or combination (nothing started), TypeError on an
    unknown keyword.
    """
    from apexrl.launch.local import PlacementError
    from apexrl.launch.start import launch_plan, make_launcher, run_banner

    argv = to_argv(kwargs)
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):  # argparse prints usage and the reason, then exits 2
            p, log_level, args = launch_plan(argv)
    except SystemExit:
        lines = errors.getvalue().strip().splitlines()
        raise ValueError(lines[-1].split("error: ", 1)[-1] if lines else "invalid apexrl.run arguments") from None
    try:
        launcher = make_launcher(p, log_level, args, out=out)
    except PlacementError as e:
        raise ValueError(str(e)) from None
    launcher._print(run_banner(p))
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            if stop is not None and stop.is_set():
                launcher.stop("stop requested")
                return

    watcher = threading.Thread(target=watch, name="apexrl.run-stop", daemon=True)
    watcher.start()
    try:
        status = launcher.run()
    finally:
        done.set()
        watcher.join()
    return RunResult(run_dir=p.run.run_dir, exit_status=status, final_eval=launcher.final_eval)
