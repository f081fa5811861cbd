"""A2C (synchronous advantage actor-critic, Mnih et al. 2016's A3C made synchronous) on the on-policy queue path,
as Tonic's torch A2C: :mod:`~apexrl.agents.a2c.config`, :mod:`~apexrl.agents.a2c.learner` and ``--agent a2c``
(:mod:`~apexrl.agents.a2c.agent`)."""

from __future__ import annotations

from apexrl.agents.a2c.config import A2C_FIELD_SOURCES, A2CConfig
from apexrl.agents.a2c.learner import A2CLearner

__all__ = ["A2CConfig", "A2CLearner", "A2C_FIELD_SOURCES"]
