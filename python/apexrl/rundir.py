"""What a run directory holds, read without torch: its identity (agent, env, preset, seed) and its final
evaluation. ``apexrl evaluate``, ``apexrl plot`` and ``apexrl bench-suite`` share these readers.

The identity comes from ``plan.json`` (written by ``apexrl run``) or, for a learner started by hand, from the
checkpoint's metadata (safetensors keeps it in a JSON header, read here without loading any tensor).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BEST_CHECKPOINT",
    "BEST_EVALUATION_KEY",
    "CHECKPOINT",
    "FINAL_EVAL",
    "PLAN",
    "RunDirError",
    "RunIdentity",
    "best_eval",
    "best_record",
    "checkpoint_meta",
    "final_eval",
    "identity",
    "run_seed",
]

CHECKPOINT = "checkpoint.safetensors"
BEST_CHECKPOINT = "best_checkpoint.safetensors"
"""The learner state of the run's best periodic evaluation (:mod:`apexrl.apex.best`)."""
BEST_EVALUATION_KEY = "evaluation"
"""The best checkpoint's metadata key of the evaluation that chose it."""
FINAL_EVAL = "final_eval.json"
PLAN = "plan.json"
_MAX_HEADER = 100 << 20


class RunDirError(ValueError):
    """A run directory's file cannot be read (the message names it and why)."""


@dataclass(frozen=True)
class RunIdentity:
    agent: str
    env: str
    preset: str | None
    seed: int | None

    def config_key(self) -> tuple[str, str, str]:
        """Runs with the same key are seeds of one configuration."""
        return (self.agent, self.env, self.preset or "")


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise RunDirError(f"cannot read {path}: {e}") from None


def checkpoint_meta(path: str) -> dict[str, Any]:
    """The apexrl metadata of a checkpoint, from its safetensors header (no tensor is read)."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > _MAX_HEADER:
                raise ValueError(f"header of {n} bytes")
            header = json.loads(f.read(n))
        meta = json.loads(header["__metadata__"]["apexrl"])
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        raise RunDirError(f"{path} is not a readable apexrl checkpoint: {e}") from None
    if not isinstance(meta, dict):
        raise RunDirError(f"{path}: metadata is not a JSON object")
    return meta


def identity(run_dir: str) -> RunIdentity:
    """The run's agent, env, preset and seed; RunDirError if neither plan.json nor a checkpoint says."""
    plan_path = os.path.join(run_dir, PLAN)
    if os.path.exists(plan_path):
        plan = _read_json(plan_path)
        learner = (plan.get("learner") if isinstance(plan, dict) else None) or {}
        if "agent" in learner and "env" in learner:
            return RunIdentity(
                str(learner["agent"]), str(learner["env"]), plan.get("preset"), int(learner.get("seed", 0))
            )
    ckpt = os.path.join(run_dir, CHECKPOINT)
    if os.path.exists(ckpt):
        meta = checkpoint_meta(ckpt)
        return RunIdentity(str(meta.get("agent")), str(meta.get("env")), (meta.get("extra") or {}).get("preset"), None)
    raise RunDirError(f"{run_dir} has neither {PLAN} nor {CHECKPOINT}: which agent and env ran there is unknown")


def run_seed(run_dir: str) -> int:
    """The run's seed (plan.json), 0 when unknown."""
    plan_path = os.path.join(run_dir, PLAN)
    if not os.path.exists(plan_path):
        return 0
    return int(((_read_json(plan_path) or {}).get("learner") or {}).get("seed", 0))


def best_eval(run_dir: str) -> dict[str, Any] | None:
    """The evaluation that chose ``RUN_DIR/best_checkpoint.safetensors`` (its ``evaluation`` metadata), None
    if the run has no best checkpoint."""
    path = os.path.join(run_dir, BEST_CHECKPOINT)
    if not os.path.exists(path):
        return None
    return best_record(checkpoint_meta(path), path)


def best_record(meta: dict[str, Any], path: str) -> dict[str, Any]:
    """The record (``evaluation``) in the metadata ``meta`` of the best checkpoint at ``path``; RunDirError if
    it has none with a finite mean."""
    record = meta.get(BEST_EVALUATION_KEY)
    if isinstance(record, dict):
        mean = record.get("mean")
        if isinstance(mean, (int, float)) and math.isfinite(mean):
            return record
    raise RunDirError(f"{path} holds no record of the evaluation that chose it ('{BEST_EVALUATION_KEY}' metadata)")


def final_eval(run_dir: str) -> dict[str, Any] | None:
    """``RUN_DIR/final_eval.json`` (written by ``apexrl evaluate --json``), None if absent."""
    path = os.path.join(run_dir, FINAL_EVAL)
    if not os.path.exists(path):
        return None
    d = _read_json(path)
    for key in ("mean", "se", "episodes"):
        if not isinstance(d, dict) or not isinstance(d.get(key), (int, float)):
            raise RunDirError(f"{path} has no number {key!r}")
    return d
