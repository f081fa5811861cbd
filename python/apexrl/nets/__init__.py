"""Network building blocks for the agents: an MLP, the Nature-DQN convolutional torso, seeded initialisation."""

from __future__ import annotations

from apexrl.nets.atari import NatureTorso
from apexrl.nets.init import build_seeded, reinit_
from apexrl.nets.mlp import MLP

__all__ = ["MLP", "NatureTorso", "build_seeded", "reinit_"]
