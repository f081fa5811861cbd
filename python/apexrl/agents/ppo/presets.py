"""The PPO presets as data (``apexrl.launch.presets.PRESETS`` holds them as ``Preset``s, as the R2D2 ones)."""

from __future__ import annotations

from typing import Any

from apexrl.agents.onpolicy.presets import cartpole_preset

__all__ = ["PPO_PRESETS"]

PPO_PRESETS: dict[str, dict[str, Any]] = {
    "ppo-cartpole": cartpole_preset(
        "ppo",
        "PPO on CartPole-v1 sized for a 2-core machine: 2 actors x 4 environments, synchronous",
        "Tonic's torch PPO and its defaults (clipped ratio 0.2, KL stop 0.015, GAE lambda 0.97, gamma 0.99, actor "
        "and critic MLPs 64-64 tanh, Adam 3e-4 / 1e-3, 80 full-batch iterations, advantage and observation "
        "normalisation), with smaller segments to learn CartPole in minutes",
        (),
    ),
    "a2c-cartpole": cartpole_preset(
        "a2c",
        "A2C on CartPole-v1 sized for a 2-core machine: 2 actors x 4 environments, synchronous",
        "Tonic's torch A2C and its defaults (one Adam 3e-4 policy-gradient step per segment, GAE lambda 0.97, "
        "gamma 0.99, MLPs 64-64 tanh, 80 critic iterations at 1e-3), with smaller segments",
        (),
    ),
    "trpo-cartpole": cartpole_preset(
        "trpo",
        "TRPO on CartPole-v1 sized for a 2-core machine: 2 actors x 4 environments, synchronous",
        "Tonic's torch TRPO and its defaults (10 conjugate-gradient steps, damping 0.1, KL bound 0.01, 10 "
        "backtracking steps of 0.8, GAE lambda 0.97, gamma 0.99, MLPs 64-64 tanh, 80 critic iterations at 1e-3), "
        "with smaller segments",
        (),
    ),
}
"""The presets of Tonic's on-policy agents by name: the fields of ``apexrl.launch.presets.Preset``."""
