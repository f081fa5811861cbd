"""The PPO presets as data (``apexrl.launch.presets.PRESETS`` holds them as ``Preset``s)."""

from __future__ import annotations

from typing import Any

from apexrl.agents.onpolicy.presets import cartpole_preset, swingup_preset

__all__ = ["PPO_PRESETS"]

_SOURCE = (
    "Tonic's torch PPO and its defaults (clipped ratio 0.2, KL stop 0.015, GAE lambda 0.97, gamma 0.99, actor and "
    "critic MLPs 64-64 tanh, Adam 3e-4 / 1e-3, 80 full-batch iterations, advantage and observation normalisation), "
    "with smaller segments"
)

PPO_PRESETS: dict[str, dict[str, Any]] = {
    "ppo-cartpole": cartpole_preset(
        "ppo",
        "PPO on CartPole-v1 sized for a 2-core machine: 2 actors x 4 environments, synchronous",
        _SOURCE + " to learn CartPole in minutes",
        (),
    ),
    "ppo-cartpole-swingup": swingup_preset(
        "ppo",
        "PPO on the Control Suite's cartpole-swingup sized for a 2-core machine: 2 actors x 4 environments, "
        "synchronous",
        _SOURCE,
        (),
    ),
}
"""PPO's presets by name: the fields of ``apexrl.launch.presets.Preset``."""
