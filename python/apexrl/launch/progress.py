"""Live progress of a local run, read from the processes' own progress lines.

The learner prints ``learner time_s=.. steps=.. env_frames=.. steps_per_s=.. replay_size=.. inserted_per_s=..
sampled_per_s=.. [eval_return_mean=..]`` once per metrics interval and each actor prints ``actor=I time_s=..
steps=.. episodes=.. return_mean10=.. ...`` every ``--log-every`` seconds. :class:`LogTail` reads what was
appended to a log file since the last call, :class:`Progress` keeps the latest values, and
:meth:`Progress.line` formats one compact status line. Parsing the logs (rather than querying the processes)
keeps the launcher a pure supervisor: it never opens a socket to the system it watches.

Single-threaded by contract: the launcher's loop is the only caller.
"""

from __future__ import annotations

import os
import re

__all__ = ["LogTail", "Progress", "format_duration", "parse_fields"]

_FIELD = re.compile(r"(\w+)=(\S+)")


def parse_fields(line: str) -> dict[str, str]:
    """``key=value`` pairs of a progress line (values as text)."""
    return dict(_FIELD.findall(line))


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


class _ActorState:
    """One actor's latest counters; ``episodes`` keeps counting across restarts of the process."""

    def __init__(self) -> None:
        self.episodes_before = 0  # episodes of earlier (crashed) processes of this actor
        self.episodes = 0
        self.return_mean10: float | None = None
        self.steps_per_s: float | None = None

    def update(self, fields: dict[str, str]) -> None:
        episodes = int(fields.get("episodes", "0"))
        if episodes < self.episodes:  # a restarted process counts from 0 again
            self.episodes_before += self.episodes
        self.episodes = episodes
        if fields.get("return_mean10", "-") != "-":
            self.return_mean10 = float(fields["return_mean10"])
        if "steps_per_s" in fields:
            self.steps_per_s = float(fields["steps_per_s"])

    @property
    def total_episodes(self) -> int:
        return self.episodes_before + self.episodes


class Progress:
    """Latest learner and actor values; :meth:`feed` takes a process name and its new log lines."""

    def __init__(self, num_actors: int):
        self.learner: dict[str, str] = {}
        self.eval_return: float | None = None
        self.eval_count = 0
        self.actors = [_ActorState() for _ in range(num_actors)]
        self.restarts = 0

    def feed(self, name: str, lines: list[str]) -> bool:
        """Consume lines of process ``name``; True when a new evaluation result arrived."""
        new_eval = False
        for line in lines:
            if line.startswith("learner time_s="):
                self.learner = parse_fields(line)
                if "eval_return_mean" in self.learner:
                    self.eval_return = float(self.learner["eval_return_mean"])
                    self.eval_count += 1
                    new_eval = True
            elif line.startswith("actor="):
                fields = parse_fields(line)
                i = int(fields["actor"])
                if 0 <= i < len(self.actors):
                    self.actors[i].update(fields)
        return new_eval

    @property
    def learner_steps(self) -> int:
        return int(self.learner.get("steps", 0))

    def line(self, elapsed: float, limit_s: float | None, max_steps: int | None) -> str:
        """One status line: time, learner, replay, evaluation, actors, restarts."""
        t = format_duration(elapsed)
        if limit_s:
            t += f"/{format_duration(limit_s)} (left {format_duration(limit_s - elapsed)})"
        L = self.learner
        steps = f"{self.learner_steps}" + (f"/{max_steps}" if max_steps else "")
        if L:
            learner = f"steps {steps} ({float(L.get('steps_per_s', 0)):.0f}/s)"
            replay = (f"replay {L.get('replay_size', '-')} +{float(L.get('inserted_per_s', 0)):.0f}/s "
                      f"sampled {float(L.get('sampled_per_s', 0)):.0f}/s")
        else:
            learner, replay = "learner starting", "replay -"
        ev = f"eval {self.eval_return:.1f}" if self.eval_return is not None else "eval -"
        returns = [a.return_mean10 for a in self.actors if a.return_mean10 is not None]
        ret = f"{sum(returns) / len(returns):.1f}" if returns else "-"
        episodes = sum(a.total_episodes for a in self.actors)
        return (f"[{t}] {learner} | {replay} | {ev} | actors {len(self.actors)} episodes {episodes} "
                f"return10 {ret} | restarts {self.restarts}")
