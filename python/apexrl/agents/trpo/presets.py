"""The TRPO presets as data (``apexrl.launch.presets.PRESETS`` holds them as ``Preset``s)."""

from __future__ import annotations

from typing import Any

from apexrl.agents.onpolicy.presets import cartpole_preset

__all__ = ["TRPO_PRESETS"]

TRPO_PRESETS: dict[str, dict[str, Any]] = {
    "trpo-cartpole": cartpole_preset(
        "trpo",
        "TRPO on CartPole-v1 sized for a 2-core machine: 2 actors x 4 environments, synchronous",
        "Tonic's torch TRPO and its defaults (10 conjugate-gradient steps, damping 0.1, KL bound 0.01, 10 "
        "backtracking steps of 0.8, GAE lambda 0.97, gamma 0.99, MLPs 64-64 tanh, 80 critic iterations at 1e-3), "
        "with smaller segments",
        (),
    ),
}
"""TRPO's presets by name: the fields of ``apexrl.launch.presets.Preset``."""
