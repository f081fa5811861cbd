"""Live progress of a local run, read from the processes' own progress records.

The learner appends one JSON object per metrics row (``{"role": "learner", "time_s", "learner_steps",
"learner_steps_per_s", "replay_size", "inserted_per_s", "sampled_per_s", "eval_return_mean"?, ...}``) and each
actor one every ``log_every`` seconds (``{"role": "actor", "actor", "steps", "episodes", "return_mean10",
...}``) to the progress file the run plan gives it (:mod:`apexrl.apex.report`). :class:`RecordTail` reads the
records appended since the last call, :class:`Progress` keeps the latest values, and :meth:`Progress.line`
formats one compact status line. Reading files (rather than querying the processes) keeps the launcher a pure
supervisor: it never opens a socket to the system it watches.

Single-threaded by contract: the launcher's loop is the only caller.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["LogTail", "Progress", "RecordTail", "format_duration"]


def format_duration(seconds: float) -> str:
    """``m:ss`` below an hour, ``h:mm:ss`` above."""
    s = max(int(seconds), 0)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class LogTail:
    """Complete lines appended to a file since the previous :meth:`read` (a partial last line waits)."""

    def __init__(self, path: str):
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return [ln.decode("utf-8", "replace") for ln in lines]

    def skip_to_end(self) -> None:
        self._offset = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        self._partial = b""


class RecordTail(LogTail):
    """JSON records (one object per line) appended to a file since the previous :meth:`records`; a line that
    is not a JSON object (a torn write of a killed process) is skipped."""

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.read():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out


class _ActorState:
    """One actor's latest counters; ``episodes`` keeps counting across restarts of the process."""

    def __init__(self) -> None:
        self.episodes_before = 0  # episodes of earlier (crashed) processes of this actor
        self.episodes = 0
        self.return_mean10: float | None = None
        self.steps_per_s: float | None = None

    def update(self, record: dict[str, Any]) -> None:
        episodes = int(record.get("episodes", 0))
        if episodes < self.episodes:  # a restarted process counts from 0 again
            self.episodes_before += self.episodes
        self.episodes = episodes
        if record.get("return_mean10") is not None:
            self.return_mean10 = float(record["return_mean10"])
        if record.get("steps_per_s") is not None:
            self.steps_per_s = float(record["steps_per_s"])

    @property
    def total_episodes(self) -> int:
        return self.episodes_before + self.episodes


class Progress:
    """Latest learner and actor values; :meth:`feed` takes a process name and its new records."""

    def __init__(self, num_actors: int):
        self.learner: dict[str, Any] = {}
        self.eval_return: float | None = None
        self.eval_count = 0
        self.actors = [_ActorState() for _ in range(num_actors)]
        self.restarts = 0

    def feed(self, name: str, records: list[dict[str, Any]]) -> bool:
        """Consume records of process ``name``; True when a new evaluation result arrived."""
        new_eval = False
        for record in records:
            role = record.get("role")
            if role == "learner":
                self.learner = record
                if record.get("eval_return_mean") is not None:
                    self.eval_return = float(record["eval_return_mean"])
                    self.eval_count += 1
                    new_eval = True
            elif role == "actor":
                i = record.get("actor")
                if isinstance(i, int) and 0 <= i < len(self.actors):
                    self.actors[i].update(record)
        return new_eval

    @property
    def learner_steps(self) -> int:
        return int(self.learner.get("learner_steps", 0))

    def line(self, elapsed: float, limit_s: float | None, max_steps: int | None) -> str:
        """One status line: time, learner, replay, evaluation, actors, restarts."""
        t = format_duration(elapsed)
        if limit_s:
            t += f"/{format_duration(limit_s)} (left {format_duration(limit_s - elapsed)})"
        L = self.learner
        steps = f"{self.learner_steps}" + (f"/{max_steps}" if max_steps else "")
        if L:
            learner = f"steps {steps} ({float(L.get('learner_steps_per_s') or 0):.0f}/s)"
            size = L.get("replay_size")
            replay = (
                f"replay {'-' if size is None else size} +{float(L.get('inserted_per_s') or 0):.0f}/s "
                f"sampled {float(L.get('sampled_per_s') or 0):.0f}/s"
            )
        else:
            learner, replay = "learner starting", "replay -"
        ev = f"eval {self.eval_return:.1f}" if self.eval_return is not None else "eval -"
        returns = [a.return_mean10 for a in self.actors if a.return_mean10 is not None]
        ret = f"{sum(returns) / len(returns):.1f}" if returns else "-"
        episodes = sum(a.total_episodes for a in self.actors)
        return (
            f"[{t}] {learner} | {replay} | {ev} | actors {len(self.actors)} episodes {episodes} "
            f"return10 {ret} | restarts {self.restarts}"
        )
