"""The IMPALA presets as data (``apexrl.launch.presets.PRESETS`` holds them as ``Preset``s): each entry holds the
fields of ``Preset`` by name, its one table the queue ``default``."""

from __future__ import annotations

from typing import Any

from apexrl.agents.onpolicy.presets import queue_table

__all__ = ["IMPALA_PRESETS"]


def _impala_preset(env: str, task: str, minutes: float, learner: dict[str, Any]) -> dict[str, Any]:
    return dict(
        description=f"IMPALA on {task} sized for a 2-core machine: 2 actors x 4 environments acting on",
        source="Acme's IMPALA and its defaults (batches of 16 sequences of 20 steps, Adam 1e-3, entropy cost "
        "0.01, baseline cost 0.5, V-trace with rho_bar = c_bar = 1)",
        agent="impala",
        env=env,
        tables=(
            # 4 batches: the limiter holds the actors once they are that far ahead of the learner.
            queue_table(64),
        ),
        learner=dict(dict(min_replay_size=16, publish_every=1, checkpoint_every=500, metrics_every=5.0), **learner),
        actor=dict(envs_per_actor=4, params_every_frames=64),
        actors=2,
        minutes=minutes,
        final_eval_episodes=10,
        sources={"*": "apexrl"},
        unmatched=(
            "a queue of 64 sequences (Acme: 10,000), so that the lag stays within a few updates on 2 cores",
            "separate actor and critic MLPs (Tonic's) where Acme's network shares its torso",
        ),
    )


IMPALA_PRESETS: dict[str, dict[str, Any]] = {
    "impala-cartpole": _impala_preset("gym:CartPole-v1", "CartPole-v1", 5.0, dict(eval_every=20.0, eval_episodes=10)),
    # The Control Suite's family (``--agent impala`` on any ``dmc:`` task starts from it): evaluations of 5 episodes
    # of 1,000 steps every 30 s.
    "impala-cartpole-swingup": _impala_preset(
        "dmc:cartpole-swingup", "the Control Suite's cartpole-swingup", 20.0, dict(eval_every=30.0, eval_episodes=5)
    ),
}
"""The IMPALA presets by name: the fields of ``apexrl.launch.presets.Preset`` (module docstring)."""
