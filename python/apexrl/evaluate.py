"""``apexrl evaluate RUN_DIR``: score a run's checkpoint with evaluation episodes, optionally on video.

The checkpoint (``RUN_DIR/checkpoint.safetensors``, the last; with ``--best``
``RUN_DIR/best_checkpoint.safetensors``, the state of the best periodic evaluation, :mod:`apexrl.apex.best`) names
its agent, environment and agent config; the agent's learner is rebuilt from them and loaded, and a policy (actor 0
of 1) takes the learner's policy weights (a run with ``eval_weights="polyak"``: the checkpoint's Polyak average of them,
:mod:`apexrl.apex.polyak`), so any registered agent is evaluated without agent-specific code. Episodes follow the evaluation protocol of
:func:`apexrl.apex.evaluator.play_episodes` on ``make_env(env, seed, evaluation=True)``.

``--video`` records the *first* of the scored episodes (rendering does not change the environment's state or
the policy's random draws, so the returns are the same with or without a video).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from apexrl import video as video_mod
from apexrl.rundir import BEST_CHECKPOINT, CHECKPOINT, FINAL_EVAL, RunDirError, run_seed

__all__ = ["EvaluateError", "Evaluation", "evaluate_run", "default_seed"]


class EvaluateError(Exception):
    """The run cannot be evaluated (the message says why); the CLI prints it and exits 2."""


@dataclass(frozen=True)
class Evaluation:
    agent: str
    env: str
    preset: str | None
    checkpoint: str
    learner_steps: int
    env_frames: int
    time_s: float
    seed: int
    returns: list[float]
    mean: float
    std: float
    se: float
    checkpoint_kind: str = "last"
    """Which checkpoint was scored: ``"last"`` or ``"best"``."""
    chosen_by: dict[str, Any] | None = None
    """For the best checkpoint, the periodic evaluation that chose it (its mean is a selection's, optimistic)."""
    eval_weights: str = "online"
    """Which weights were scored: ``"online"`` (the ones the actors acted with) or ``"polyak"`` (the run's
    average of them, stored in its checkpoints)."""

    def to_json(self) -> dict[str, Any]:
        """The keys of ``--json`` (and of ``RUN_DIR/final_eval.json`` when the launcher asks for it)."""
        return {
            "agent": self.agent,
            "env": self.env,
            "preset": self.preset,
            "checkpoint": self.checkpoint,
            "checkpoint_kind": self.checkpoint_kind,
            "chosen_by": self.chosen_by,
            "eval_weights": self.eval_weights,
            "learner_steps": self.learner_steps,
            "env_frames": self.env_frames,
            "time_s": self.time_s,
            "episodes": len(self.returns),
            "mean": self.mean,
            "std": self.std,
            "se": self.se,
            "returns": self.returns,
            "seed": self.seed,
        }

    def summary(self) -> str:
        weights = " (Polyak-averaged weights)" if self.eval_weights == "polyak" else ""
        text = (
            f"{self.env} {self.agent}: {self.mean:.2f} ± {self.se:.2f} (SE) over {len(self.returns)} episodes; "
            f"{self.checkpoint_kind} checkpoint{weights} at learner step {self.learner_steps}, {self.env_frames} env frames, "
            f"{self.time_s / 60:.1f} min"
        )
        if self.chosen_by is not None:
            c = self.chosen_by
            text += (
                f"; chosen by its periodic evaluation of {c['mean']:.2f} over {c.get('episodes')} "
                "episodes (the best of the run's: an optimistic estimate)"
            )
        return text


def default_seed(run_dir: str, best: bool = False) -> int:
    """The run's own evaluation stream (the learner's evaluator uses ``seed * 10007 + 5003``): away from the
    actors' seeds ``seed * 10007 + i``. For the best checkpoint ``seed * 10007 + 6007``: the periodic evaluations
    chose it on the evaluation stream's episodes, so scoring it on those again (the same starting states, when
    the first evaluation chose it) would repeat the selection's luck."""
    return run_seed(run_dir) * 10007 + (6007 if best else 5003)


def _load(path: str, best: bool) -> tuple[dict, dict, dict | None]:
    """(tensors, meta, the evaluation that chose a best checkpoint; None for the last)."""
    from apexrl.apex.best import load_best
    from apexrl.apex.checkpoint import CheckpointError, load_checkpoint

    try:
        return load_best(path) if best else (*load_checkpoint(path), None)
    except CheckpointError as e:
        raise EvaluateError(str(e)) from None


def _agent_config(agent_def: Any, raw: Any) -> Any:
    from apexrl.apex.config import agent_config_from_dict

    try:
        return agent_config_from_dict(agent_def.config_class, raw or {})
    except (TypeError, ValueError) as e:
        raise EvaluateError(f"the checkpoint's agent_config does not fit {agent_def.name}: {e}") from None


def evaluate_run(
    run_dir: str,
    episodes: int = 10,
    seed: int | None = None,
    video: str | None = None,
    device: str = "cpu",
    best: bool = False,
) -> Evaluation:
    """Play ``episodes`` evaluation episodes with the last checkpoint of ``run_dir`` (``best``: its best
    checkpoint); EvaluateError if it cannot."""
    if not os.path.isdir(run_dir):
        raise EvaluateError(f"{run_dir} is not a directory")
    path = os.path.join(run_dir, BEST_CHECKPOINT if best else CHECKPOINT)
    if not os.path.exists(path):
        raise EvaluateError(
            f"{run_dir} has no {BEST_CHECKPOINT} (the learner writes it when a periodic evaluation scores higher "
            "than every earlier one: none has finished in this run yet, or the run is older than best checkpoints)"
            if best
            else f"{run_dir} has no {CHECKPOINT} (the learner writes it while it trains)"
        )
    if episodes < 1:
        raise EvaluateError(f"--episodes must be >= 1, got {episodes}")
    try:
        writer = video_mod.open_writer(video) if video else None  # a missing package fails before any episode
    except video_mod.VideoError as e:
        raise EvaluateError(str(e)) from None
    try:
        return _evaluate(run_dir, path, episodes, seed, writer, device, best)
    except video_mod.VideoError as e:
        if writer is not None:  # only a writer raises VideoError
            writer.abort()
        raise EvaluateError(str(e)) from None
    except BaseException:
        if writer is not None:
            writer.abort()
        raise


def _evaluate(
    run_dir: str, path: str, episodes: int, seed: int | None, writer: Any, device: str, best: bool
) -> Evaluation:
    import torch

    from apexrl.agents import get_agent
    from apexrl.apex.evaluator import EvalResult, play_episodes
    from apexrl.apex.polyak import evaluated_weights, split_average
    from apexrl.envs import make_env

    try:
        torch_device = torch.device(device)
    except RuntimeError as e:
        raise EvaluateError(f"--device {device!r}: {e}") from None
    tensors, meta, chosen_by = _load(path, best)
    tensors, average = split_average(tensors)
    try:
        agent_def = get_agent(str(meta.get("agent")))
        env_name = str(meta["env"])
    except (KeyError, ValueError) as e:
        raise EvaluateError(f"{path}: {e}") from None
    cfg = _agent_config(agent_def, meta.get("agent_config"))
    if seed is None:
        try:
            seed = default_seed(run_dir, best)
        except RunDirError as e:
            raise EvaluateError(str(e)) from None
    if writer is not None:
        video_mod.prepare_rendering(env_name)
    try:
        environment = make_env(env_name, seed=seed, evaluation=True)
    except (ValueError, ImportError) as e:
        raise EvaluateError(str(e)) from None
    try:
        torch.set_num_threads(1)
        learner = agent_def.make_learner(environment.spec, cfg, torch_device, seed)
        try:
            learner.load_state_dict(tensors)
        except (ValueError, KeyError, RuntimeError) as e:
            raise EvaluateError(f"{path} does not load into a {agent_def.name} learner: {e}") from None
        policy = agent_def.make_policy(environment.spec, cfg, 0, 1, seed)
        try:
            policy.load_policy_state_dict(evaluated_weights(learner.policy_state_dict(), average))
        except ValueError as e:
            raise EvaluateError(f"{path}: {e}") from None
        returns: list[float] = []
        if writer is not None:
            writer.begin(environment.render_fps)
            returns += play_episodes(environment, policy, 1, on_frame=writer.frame_of)
            writer.close()
        returns += play_episodes(environment, policy, episodes - len(returns))
    finally:
        environment.close()
    r = EvalResult.of(
        returns, int(meta.get("learner_steps", 0)), int(meta.get("env_frames", 0)), float(meta.get("time_s", 0.0))
    )
    preset = (meta.get("extra") or {}).get("preset")
    return Evaluation(
        agent_def.name,
        env_name,
        preset,
        os.path.abspath(path),
        r.learner_steps,
        r.env_frames,
        r.time_s,
        int(seed),
        [float(x) for x in returns],
        r.mean,
        r.std,
        r.se,
        "best" if best else "last",
        chosen_by,
        "polyak" if average else "online",
    )


def write_json(evaluation: Evaluation, path: str) -> None:
    """Atomically (a reader such as ``bench-suite`` never sees half a file)."""
    from apexrl.durable import write_atomically

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomically(path, (json.dumps(evaluation.to_json(), indent=1) + "\n").encode())


__all__ += ["FINAL_EVAL", "write_json"]
