"""TensorBoard event files of a run's metrics: ``--tensorboard DIR`` of ``apexrl run`` and ``apexrl-learner``
(``pip install 'apexrl[tensorboard]'``).

The CSV files stay the record that ``apexrl plot`` and the suite read; the event files are a live view of the same
rows, for watching a run in TensorBoard (``tensorboard --logdir DIR``). Every value is the CSV's own cell (six
significant digits), so the event file and the CSV hold the same numbers. Tags:

- ``learner/<column>``: each column of ``metrics.csv`` at the row's ``learner_steps``, except the ``eval_*`` ones;
- ``eval/<name>``: the ``eval_*`` columns of the rows in which an evaluation finished (``eval_return_mean`` becomes
  ``eval/return_mean``), at the learner step its weights were taken (``eval_learner_steps``);
- ``episodes/return/actor_<i>`` and ``episodes/length/actor_<i>``: each row of ``episodes.csv``, at that actor's
  env frames.

``apexrl-learner --tensorboard DIR`` writes its metrics rows as it writes them to ``metrics.csv``
(:class:`MetricsBoard`). ``apexrl run --tensorboard DIR`` follows ``RUN_DIR/metrics.csv`` and
``RUN_DIR/episodes.csv`` from the launcher (:class:`RunMirror`), so the learner's rows and every actor's episodes go to
one event file, on a Ray cluster too (the rows come back to ``RUN_DIR`` on the head). A resumed run that is given the
DIR of its earlier run adds only its new rows; given a new DIR it writes the whole history from the CSV files.
"""

from __future__ import annotations

import csv
import glob
import os
from collections.abc import Mapping, Sequence
from typing import Any

from apexrl.apex.metrics import cell_text
from apexrl.durable import make_private_dirs

__all__ = [
    "EXTRA",
    "CSVFollower",
    "MetricsBoard",
    "RunMirror",
    "TensorBoardMissing",
    "check_logdir",
    "require_tensorboard",
]

EXTRA = "tensorboard"
"""The package extra that installs TensorBoard: ``pip install 'apexrl[tensorboard]'``."""
STEP_COLUMNS = ("learner_steps", "eval_learner_steps")
"""metrics.csv's columns that are the steps of the others, not scalars of their own."""


class TensorBoardMissing(ImportError):
    """``--tensorboard`` was given but the tensorboard package is not installed (the message says how to)."""


def require_tensorboard(flag: str = "--tensorboard") -> None:
    """TensorBoardMissing, naming the extra, when torch's TensorBoard writer cannot be imported."""
    try:
        import torch.utils.tensorboard  # noqa: F401  (needs the tensorboard package)
    except ImportError as e:
        raise TensorBoardMissing(
            f"{flag} needs the tensorboard package: pip install 'apexrl[{EXTRA}]' ({type(e).__name__}: {e})"
        ) from None


def check_logdir(path: str, flag: str = "--tensorboard") -> None:
    """What a command checks before it starts: TensorBoardMissing without the package, ValueError when ``path``
    exists and is not a directory (nothing is created here)."""
    require_tensorboard(flag)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag} {path}: not a directory")


def _number(text: str | None) -> float | None:
    if text is None or text == "":
        return None
    try:
        return float(text)
    except ValueError:
        return None


class MetricsBoard:
    """A TensorBoard event file in ``logdir`` (created 0700 when new) holding metrics and episode rows. Not
    thread-safe: one writer thread. Each ``add_*`` call flushes, so TensorBoard shows the row at once."""

    def __init__(self, logdir: str):
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        make_private_dirs(logdir)
        self.logdir = logdir
        self._writer = SummaryWriter(log_dir=logdir)

    def add_metrics_row(self, row: Mapping[str, Any]) -> None:
        """One row of metrics.csv (values, or the CSV's text cells); empty cells are no scalar."""
        cells = {k: v if isinstance(v, str) else cell_text(v) for k, v in row.items()}
        step = _number(cells.get("learner_steps"))
        eval_step = _number(cells.get("eval_learner_steps"))
        for name, text in cells.items():
            value = _number(text)
            if value is None or name in STEP_COLUMNS:
                continue
            if name.startswith("eval_"):
                if eval_step is not None:
                    self._writer.add_scalar(f"eval/{name[len('eval_') :]}", value, int(eval_step))
            elif step is not None:
                self._writer.add_scalar(f"learner/{name}", value, int(step))
        self._writer.flush()

    def add_episode_rows(self, rows: Sequence[Mapping[str, str]]) -> None:
        """Rows of episodes.csv (its text cells)."""
        for row in rows:
            actor, frames = _number(row.get("actor")), _number(row.get("env_frames"))
            if actor is None or frames is None:
                continue
            for name in ("return", "length"):
                value = _number(row.get(name))
                if value is not None:
                    self._writer.add_scalar(f"episodes/{name}/actor_{int(actor)}", value, int(frames))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class CSVFollower:
    """The complete rows a CSV file gains, as dicts of text cells: :meth:`rows` returns those written since the
    last call (a line without its newline yet waits for the next). The file may appear later; one that shrinks
    (rewritten) is read again from its header."""

    def __init__(self, path: str):
        self.path = path
        self._offset = 0
        self._header: list[str] | None = None

    def skip_to_end(self) -> None:
        """Start after the rows the file holds now."""
        self.rows()

    def rows(self) -> list[dict[str, str]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(0, os.SEEK_END)
                if f.tell() < self._offset:
                    self._offset, self._header = 0, None
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        if end == 0:
            return []
        self._offset += end
        lines = data[:end].decode("utf-8", "replace").splitlines()
        out = []
        for cells in csv.reader(lines):
            if self._header is None:
                self._header = cells
            elif len(cells) == len(self._header):
                out.append(dict(zip(self._header, cells)))
        return out


class RunMirror:
    """``apexrl run --tensorboard DIR``: the rows ``RUN_DIR/metrics.csv`` and ``RUN_DIR/episodes.csv`` gain, into an
    event file in ``logdir``. When ``logdir`` already holds event files (an earlier run of this run directory
    wrote them) only the rows written from now on are added."""

    def __init__(self, logdir: str, run_dir: str):
        earlier = bool(glob.glob(os.path.join(glob.escape(logdir), "events.out.tfevents.*")))
        self.board = MetricsBoard(logdir)
        self.metrics = CSVFollower(os.path.join(run_dir, "metrics.csv"))
        self.episodes = CSVFollower(os.path.join(run_dir, "episodes.csv"))
        if earlier:
            self.metrics.skip_to_end()
            self.episodes.skip_to_end()

    def poll(self) -> None:
        for row in self.metrics.rows():
            self.board.add_metrics_row(row)
        rows = self.episodes.rows()
        if rows:
            self.board.add_episode_rows(rows)

    def close(self) -> None:
        self.poll()
        self.board.close()
