"""The process host: one child process of a run, inside a Ray actor on whichever node Ray placed it.

The Ray launcher (:mod:`apexrl.launch.ray_launcher`) makes one :class:`ProcessHost` actor per child. The host
writes the run plan on its node (with the child's progress and episode files moved to a node-local folder),
starts ``python -m apexrl.cli.X --plan ...`` there in its own process group, and answers the launcher's
polls: the exit status and the lines its files gained since the last poll (log, progress records, episodes),
which the launcher appends to the run directory on its own machine. Data never goes through Ray: the processes
talk ZeroMQ to each other; Ray only places, starts and restarts hosts, and carries these small polls.

A host that dies (``ray.kill``, its node lost) takes its process with it (``PR_SET_PDEATHSIG``); Ray restarts
the host with the same constructor arguments, maybe on another node, and it starts nothing by itself: the
launcher's supervisor sees the loss and starts the process again with the child's restart flags. Every method
is cheap and none is retried (``max_task_retries=0``): ``start`` on a running process returns it unchanged.

Only the standard library and apexrl.launch.orphans are imported here (and Ray's own module for the node's id), so a
host stays small.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from apexrl.launch.orphans import die_with_parent

__all__ = ["MAX_SHIP_BYTES", "PLAN_ARG", "ProcessHost", "localize_plan"]

PLAN_ARG = "{plan}"
"""Stands for the host's own copy of the plan in a child's arguments."""
MAX_SHIP_BYTES = 256 * 1024
"""At most this much of each file per poll (the rest comes with the next)."""
FILES = ("log", "progress", "episodes")


def localize_plan(plan: dict[str, Any], role: str, index: int, files: dict[str, str]) -> dict[str, Any]:
    """The plan (its JSON object) with this child's progress records and episode rows going to ``files``."""
    if role == "learner":
        plan["learner"]["progress_path"] = files["progress"]
    elif role == "actor":
        plan["actors"][index]["progress_path"] = files["progress"]
        plan["actors"][index]["episodes_csv"] = files["episodes"]
    return plan


class ProcessHost:
    """One child process of a run on this node (decorated with ``ray.remote`` by the launcher)."""

    def __init__(self, name: str, role: str, index: int, plan_json: str):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix=f"apexrl-{name}-")
        self.files = {kind: os.path.join(self.dir, f"{name}.{kind}") for kind in FILES}
        self.plan_path = os.path.join(self.dir, "plan.json")
        with open(self.plan_path, "w", encoding="utf-8") as f:
            json.dump(localize_plan(json.loads(plan_json), role, index, self.files), f)
        self.offsets = dict.fromkeys(FILES, 0)
        self.proc: subprocess.Popen | None = None

    def start(self, module: str, args: list[str]) -> dict[str, Any]:
        """Start the process (unless it runs); its pid and node."""
        if self.proc is None or self.proc.poll() is not None:
            args = [self.plan_path if a == PLAN_ARG else a for a in args]
            with open(self.files["log"], "ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", module, *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    cwd=self.dir,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
        return self.where()

    def where(self) -> dict[str, Any]:
        import ray

        return {
            "pid": None if self.proc is None else self.proc.pid,
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
        }

    def report(self) -> dict[str, Any]:
        """``state`` (none: never started by this host; running; exited, with ``code``) and each file's new
        complete lines (``lines``: kind -> text)."""
        code = None if self.proc is None else self.proc.poll()  # before reading: an exited process adds nothing
        state = "none" if self.proc is None else "running" if code is None else "exited"
        return {"state": state, "code": code, "lines": {kind: self._new_lines(kind) for kind in FILES}}

    def _new_lines(self, kind: str) -> str:
        try:
            with open(self.files[kind], "rb") as f:
                f.seek(self.offsets[kind])
                data = f.read(MAX_SHIP_BYTES)
        except FileNotFoundError:
            return ""
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) < MAX_SHIP_BYTES:
            return ""  # a partial last line waits for its end
        data = data[:end] if end else data
        self.offsets[kind] += len(data)
        return data.decode("utf-8", "replace")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """At the end of the run (the process has stopped): remove the node-local folder."""
        shutil.rmtree(self.dir, ignore_errors=True)
