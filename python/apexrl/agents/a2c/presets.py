"""The A2C presets as data (``apexrl.launch.presets.PRESETS`` holds them as ``Preset``s)."""

from __future__ import annotations

from typing import Any

from apexrl.agents.onpolicy.presets import cartpole_preset, swingup_preset

__all__ = ["A2C_PRESETS"]

_SOURCE = (
    "Tonic's torch A2C and its defaults (one Adam 3e-4 policy-gradient step per segment, GAE lambda 0.97, gamma "
    "0.99, MLPs 64-64 tanh, 80 critic iterations at 1e-3), with smaller segments"
)

A2C_PRESETS: dict[str, dict[str, Any]] = {
    "a2c-cartpole": cartpole_preset(
        "a2c", "A2C on CartPole-v1 sized for a 2-core machine: 2 actors x 4 environments, synchronous", _SOURCE, ()
    ),
    "a2c-cartpole-swingup": swingup_preset(
        "a2c",
        "A2C on the Control Suite's cartpole-swingup sized for a 2-core machine: 2 actors x 4 environments, "
        "synchronous",
        _SOURCE,
        (),
    ),
}
"""A2C's presets by name: the fields of ``apexrl.launch.presets.Preset``."""
