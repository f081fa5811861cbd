"""The settings every on-policy agent shares (:class:`OnPolicyConfig`; PPO, A2C, TRPO and IMPALA extend it) and
where each default comes from (Tonic's torch agents unless said otherwise)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from apexrl.agents.config import (
    _check_bool,
    _check_layers,
    _check_positive_floats,
    _check_positive_ints,
    _check_unit,
)

__all__ = ["ONPOLICY_FIELD_SOURCES", "ONPOLICY_SOURCES", "OnPolicyConfig"]

ONPOLICY_SOURCES: dict[str, str] = {
    "Tonic": "Pardo 2020, Tonic: A Deep Reinforcement Learning Library for Fast Prototyping and Benchmarking "
    "(arXiv:2011.07537): its torch agents A2C, TRPO and PPO with their defaults (fabiopardo/tonic)",
    "Acme IMPALA": "Acme's IMPALA (Hoffman et al. 2020, arXiv:2006.00979; acme/agents/jax/impala: its config and "
    "loss) after Espeholt et al. 2018, IMPALA (ICML 2018), V-trace as rlax.vtrace",
}
"""The source keys the on-policy settings name, with their citations (every on-policy ``AgentDef``'s ``sources``)."""


@dataclass(frozen=True)
class OnPolicyConfig:
    """What the on-policy data path and the actor-critic networks need."""

    n_step: int = 1
    """Unused (the advantage estimator sets the horizon); AgentDef requires the field. Must be 1."""
    gamma: float = 0.99
    """Discount per agent step."""
    batch_size: int = 8
    """Items (sequences of ``unroll`` trained steps) the learner pops per update."""
    unroll: int = 64
    """Trained steps per item: actors write items of ``unroll + 1`` steps every ``unroll`` steps (consecutive
    items share one step, the earlier one's bootstrap), so every step is trained exactly once."""
    lam: float = 0.97
    """Trace decay of the advantage estimates (Tonic's ``trace_decay``: GAE lambda)."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layers (tanh) of the actor and of the critic, two separate networks."""
    actor_lr: float = 3e-4
    """Adam learning rate of the actor (TRPO: unused, its step is the line search's)."""
    critic_lr: float = 1e-3
    """Adam learning rate of the critic."""
    critic_iterations: int = 80
    """Critic regression steps on each popped batch (Tonic's ``batch_iterations``)."""
    minibatch_size: int | None = None
    """Steps per minibatch of those iterations; None: the whole batch each time (Tonic's default)."""
    normalize_advantages: bool = True
    """Advantages minus their mean over the batch, over their standard deviation (Tonic's ``Segment``)."""
    obs_norm: bool = True
    """Normalise observations with running statistics of the popped batches (Tonic's ``MeanStd``)."""
    synchronous: bool = True
    """Actors wait for weights newer than those they acted with once every environment has made an item (Tonic
    acts and learns in turn); False: they act on, the queue's size bounding the lag."""
    gradient_clip: float | None = None
    """Clip each network's gradient norm to this; None: no clipping (Tonic's 0)."""

    def __post_init__(self) -> None:
        if self.n_step != 1:
            raise ValueError(f"{type(self).__name__}.n_step must be 1 (the advantage estimator sets the horizon)")
        _check_positive_ints(self, "batch_size", "unroll", "critic_iterations")
        if self.minibatch_size is not None:
            _check_positive_ints(self, "minibatch_size")
        _check_unit(self, "gamma", "lam")
        _check_positive_floats(self, "actor_lr", "critic_lr")
        _check_positive_floats(self, "gradient_clip", allow_none=True)
        _check_layers(self, "hidden")
        _check_bool(self, "normalize_advantages", "obs_norm", "synchronous")
        if not math.isfinite(self.gamma):
            raise ValueError(f"{type(self).__name__}.gamma must be finite, got {self.gamma!r}")


ONPOLICY_FIELD_SOURCES: dict[str, str] = dict(
    n_step="apexrl",
    gamma="Tonic",
    batch_size="apexrl",
    unroll="apexrl",
    lam="Tonic",
    hidden="Tonic",
    actor_lr="Tonic",
    critic_lr="Tonic",
    critic_iterations="Tonic",
    minibatch_size="Tonic",
    normalize_advantages="Tonic",
    obs_norm="Tonic",
    synchronous="Tonic",
    gradient_clip="Tonic",
)
"""Where each OnPolicyConfig default comes from (keys of ``apexrl.launch.preset_table.SOURCES``)."""
