"""The best checkpoint: the learner state whose periodic evaluation scored highest, kept beside the last one.

``RUN_DIR/best_checkpoint.safetensors`` has the format of ``checkpoint.safetensors`` (so ``apexrl evaluate
--best`` loads it like the last one) and holds the learner state at the moment the chosen evaluation's weights
were taken. The evaluation that chose it (mean, std, se, episodes, learner_steps, env_frames, time_s: an
:class:`~apexrl.apex.evaluator.EvalResult`) is in the same file's metadata under ``evaluation``, not in a file
beside it: weights and record are replaced by one rename, so no crash can leave them disagreeing.

An evaluation replaces the best only with a strictly higher mean return; on a tie the earlier weights stay (the
first state to reach a score is kept, and a task capped at its maximum return keeps its first perfect one). A
non-finite mean never becomes the best. The write is :func:`~apexrl.apex.checkpoint.save_checkpoint`'s (temporary,
fsync, rename): a learner killed or failing (disk full) mid-write leaves the previous best intact, and the
record in memory changes only after the rename, so the next better evaluation tries again.

Choosing the highest of many noisy evaluations is a selection: the chosen evaluation's own mean is an optimistic
estimate of those weights' return. ``apexrl evaluate --best`` scores them again with fresh episodes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

import torch

from apexrl.apex.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from apexrl.apex.evaluator import EvalResult
from apexrl.rundir import BEST_CHECKPOINT, BEST_EVALUATION_KEY, RunDirError, best_record, checkpoint_meta

__all__ = ["BEST_CHECKPOINT", "BestCheckpoint", "load_best"]

log = logging.getLogger("apexrl.apex.learner")


def load_best(path: str) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """``(tensors, meta, evaluation)`` of a best checkpoint; CheckpointError if it is none."""
    tensors, meta = load_checkpoint(path)
    try:
        return tensors, meta, best_record(meta, path)
    except RunDirError as e:
        raise CheckpointError(str(e)) from None


class BestCheckpoint:
    """The learner's keeper of ``best_checkpoint.safetensors``: :meth:`hold` the state an evaluation is about to
    score, :meth:`offer` that evaluation's result when it finishes."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, BEST_CHECKPOINT)
        self.record: dict[str, Any] | None = None
        """The evaluation that chose the file on disk (None: this run has none yet)."""
        self.failures = 0
        """Best checkpoints that could not be written (disk full...)."""
        self._held: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None

    def resume(self, agent: str, env: str) -> None:
        """Take over the best of the run being resumed, so that only a better evaluation replaces it. A file
        that cannot be read is warned about and replaced by the next evaluation; one of another agent or
        environment is refused (ValueError), as the last checkpoint is."""
        if not os.path.exists(self.path):
            return
        try:
            meta = checkpoint_meta(self.path)  # the header only: the tensors stay on disk
        except RunDirError as e:
            log.warning("--resume: %s; the next evaluation replaces it", e)
            return
        for key, value in (("agent", agent), ("env", env)):
            if meta.get(key) != value:
                raise ValueError(
                    f"best checkpoint {self.path} is for {key}={meta.get(key)!r}, this learner has {value!r}"
                )
        try:
            self.record = best_record(meta, self.path)
        except RunDirError as e:
            log.warning("--resume: %s; the next evaluation replaces it", e)

    def hold(self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> None:
        """Keep a copy of the learner state (``state_dict()``) and its checkpoint metadata, taken with the weights
        an evaluation is about to score: training changes the live tensors before the evaluation finishes."""
        self._held = ({k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}, dict(meta))

    def beats(self, result: EvalResult) -> bool:
        """Whether ``result`` would replace the best so far (strictly higher finite mean)."""
        return _finite(result.mean) and (self.record is None or result.mean > float(self.record["mean"]))

    def offer(self, result: EvalResult) -> bool:
        """Write the held state as the best if ``result`` (its evaluation) beats the best so far; True if written.
        A failed write is warned about and counted; the previous best stays, on disk and in :attr:`record`."""
        held, self._held = self._held, None
        if held is None or not self.beats(result):
            return False
        tensors, meta = held
        if int(meta.get("learner_steps", -1)) != result.learner_steps:
            # Never pair a result with a state it did not score (the evaluator and hold() are fed together).
            log.warning(
                "evaluation of step %d does not match the held state of step %s; best checkpoint not written",
                result.learner_steps,
                meta.get("learner_steps"),
            )
            return False
        record = dataclasses.asdict(result)
        try:
            save_checkpoint(self.path, tensors, {**meta, BEST_EVALUATION_KEY: record})
        except OSError as e:
            self.failures += 1
            log.warning(
                "best checkpoint (evaluation %.2f at step %d) not written to %s (%s: %s); %s",
                result.mean,
                result.learner_steps,
                self.path,
                type(e).__name__,
                e,
                "the previous best stays valid" if self.record is not None else "there is no best yet",
            )
            return False
        self.record = record
        return True


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
