"""``--agent r2d2``: the :class:`~apexrl.agents.base.AgentDef` that registers R2D2, with its replay path
(:mod:`apexrl.agents.r2d2.replay`: sequences written per environment, read as ``.fields``/``.mask``/``.extras``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from apexrl.agents.base import AgentDef
from apexrl.agents.r2d2.config import R2D2_FIELD_SOURCES, R2D2Config
from apexrl.agents.r2d2.learner import R2D2Learner
from apexrl.agents.r2d2.policy import recurrent_batch_policy
from apexrl.agents.r2d2.presets import R2D2_PRESETS, R2D2_SOURCE
from apexrl.agents.r2d2.replay import REPLAY

if TYPE_CHECKING:
    from apexrl.envs import EnvSpec

__all__ = ["AGENT"]


def check_env(spec: EnvSpec) -> None:
    if spec.num_actions is None:
        raise ValueError("r2d2 needs a discrete action space (Q-values per action)")


# Return types Any: R2D2's learner and policy have no TransitionSpec (its replay path writes sequences), so they
# are not the Agent and Policy protocols of the feed-forward agents; the sequence path uses what they have.
def make_learner(spec: EnvSpec, config: R2D2Config, device: torch.device, seed: int) -> Any:
    return R2D2Learner(spec, config, device, seed)


def make_policy(spec: EnvSpec, config: R2D2Config, index: int, num_actors: int, seed: int) -> Any:
    """Actor ``index`` of ``num_actors``, one environment (the evaluation process: actor 0 of 1)."""
    return recurrent_batch_policy(spec, config, [index], num_actors, seed)


def make_batch_policy(spec: EnvSpec, config: R2D2Config, slots: Sequence[int], num_slots: int, seed: int) -> Any:
    return recurrent_batch_policy(spec, config, slots, num_slots, seed)


AGENT = AgentDef(
    name="r2d2",
    description="R2D2: recurrent (LSTM) dueling double Q on replayed sequences with stored state and burn-in",
    config_class=R2D2Config,
    check_env=check_env,
    make_learner=make_learner,
    make_policy=make_policy,
    make_batch_policy=make_batch_policy,
    replay=REPLAY,
    presets=R2D2_PRESETS,
    sources=R2D2_SOURCE,
    field_sources=R2D2_FIELD_SOURCES,
)
