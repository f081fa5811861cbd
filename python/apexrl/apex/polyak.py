"""Polyak-averaged evaluation weights (the learner's ``eval_weights="polyak"``).

The learner keeps an exponential moving average of the parameters the policy acts with
(``Agent.policy_modules()``), updated in place after every learner step::

    average <- average + tau * (online - average)          # torch._foreach_lerp_, no allocation

Iterate averaging (Polyak & Juditsky 1992) in its exponential form, the soft update TD3 (Fujimoto et al. 2018)
and SAC (Haarnoja et al. 2018) apply to their target networks with tau = 0.005: the average spans about
``1 / tau`` recent steps, so it smooths the step-to-step swings of fast-moving weights without lagging far
behind. Periodic evaluations, the best checkpoint and the final evaluation score the average; the actors keep
acting with the online weights, so what is explored and learnt does not change.

Only the averaged modules' parameters are averaged. Every other entry of ``policy_state_dict()`` is taken as it
is when the weights are evaluated: buffers such as the observation-normalisation statistics (an average of
running statistics is no statistic of anything), the critics the actors keep for initial priorities, versions.

In a checkpoint the average is stored beside the learner's state as ``polyak/<policy entry>`` (with
``eval_weights`` and ``polyak_tau`` in its metadata), so a resumed run continues it and ``apexrl evaluate``
scores it. Cost per learner step: one fused lerp over the averaged parameters (memory: one copy of them).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["POLYAK_PREFIX", "PolyakAverage", "evaluated_weights", "split_average"]

POLYAK_PREFIX = "polyak/"
"""Checkpoint entries of the average: ``polyak/`` + the ``policy_state_dict()`` name."""

log = logging.getLogger("apexrl.apex.learner")


def split_average(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(the learner's state, the Polyak average by policy entry name)`` of a checkpoint's tensors (the second
    empty for a checkpoint without an average)."""
    state = {k: v for k, v in tensors.items() if not k.startswith(POLYAK_PREFIX)}
    average = {k[len(POLYAK_PREFIX) :]: v for k, v in tensors.items() if k.startswith(POLYAK_PREFIX)}
    return state, average


def evaluated_weights(policy: Mapping[str, torch.Tensor], average: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """``policy`` (a ``policy_state_dict()``) with the averaged entries put in; ValueError naming any average
    entry the policy does not have."""
    unknown = sorted(set(average) - set(policy))
    if unknown:
        raise ValueError(f"the Polyak average has entries the policy does not: {', '.join(unknown[:5])}")
    return {**policy, **average}


class PolyakAverage:
    """The running average of ``agent``'s policy parameters, started at their current values."""

    def __init__(self, agent: Any, tau: float):
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"polyak_tau must be in (0, 1], got {tau}")
        modules = getattr(agent, "policy_modules", None)
        if modules is None:
            raise ValueError(f"{type(agent).__name__} has no policy_modules(): it cannot evaluate averaged weights")
        self.agent, self.tau = agent, float(tau)
        self.names: list[str] = []
        self._live: list[torch.Tensor] = []
        for prefix, module in modules().items():
            for name, param in module.named_parameters():
                if param.is_floating_point():
                    self.names.append(f"{prefix}/{name}")
                    self._live.append(param.detach())  # shares the parameter's storage: updated in place
        missing = sorted(set(self.names) - set(agent.policy_state_dict()))
        if missing:
            raise ValueError(f"policy_modules() has parameters policy_state_dict() lacks: {', '.join(missing[:5])}")
        self._avg = [p.clone() for p in self._live]

    def update(self) -> None:
        """One learner step's move of the average toward the online parameters."""
        torch._foreach_lerp_(self._avg, self._live, self.tau)

    def reset(self) -> None:
        """Restart the average at the current online parameters."""
        torch._foreach_copy_(self._avg, self._live)

    def averaged(self) -> dict[str, torch.Tensor]:
        """``{policy entry: CPU copy of its average}``."""
        return {n: a.to("cpu", copy=True) for n, a in zip(self.names, self._avg)}

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights evaluations score: the agent's ``policy_state_dict()`` with the averaged parameters."""
        return evaluated_weights(self.agent.policy_state_dict(), self.averaged())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The checkpoint entries of the average (``polyak/...``)."""
        return {POLYAK_PREFIX + n: t for n, t in self.averaged().items()}

    def load(self, average: Mapping[str, torch.Tensor]) -> None:
        """Continue a checkpoint's average (its ``polyak/`` entries, prefix removed); ValueError naming what does
        not match changes nothing."""
        problems = [f"missing {n}" for n in self.names if n not in average]
        problems += [f"unexpected {n}" for n in average if n not in self.names]
        for n, a in zip(self.names, self._avg):
            t = average.get(n)
            if t is not None and (t.shape != a.shape or t.dtype != a.dtype):
                problems.append(f"{n}: {tuple(t.shape)} {t.dtype}, expected {tuple(a.shape)} {a.dtype}")
        if problems:
            raise ValueError(f"the checkpoint's Polyak average does not fit: {'; '.join(problems[:5])}")
        with torch.no_grad():
            for n, a in zip(self.names, self._avg):
                a.copy_(average[n])
