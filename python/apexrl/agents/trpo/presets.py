"""The TRPO presets as data (``apexrl.launch.presets.PRESETS`` holds them as ``Preset``s)."""

from __future__ import annotations

from typing import Any

from apexrl.agents.onpolicy.presets import cartpole_preset, swingup_preset

__all__ = ["TRPO_PRESETS"]

_SOURCE = (
    "Tonic's torch TRPO and its defaults (10 conjugate-gradient steps, damping 0.1, KL bound 0.01, 10 backtracking "
    "steps of 0.8, GAE lambda 0.97, gamma 0.99, MLPs 64-64 tanh, 80 critic iterations at 1e-3), with smaller "
    "segments"
)

TRPO_PRESETS: dict[str, dict[str, Any]] = {
    "trpo-cartpole": cartpole_preset(
        "trpo", "TRPO on CartPole-v1 sized for a 2-core machine: 2 actors x 4 environments, synchronous", _SOURCE, ()
    ),
    "trpo-cartpole-swingup": swingup_preset(
        "trpo",
        "TRPO on the Control Suite's cartpole-swingup sized for a 2-core machine: 2 actors x 4 environments, "
        "synchronous",
        _SOURCE,
        (),
    ),
}
"""TRPO's presets by name: the fields of ``apexrl.launch.presets.Preset``."""
