"""The optimiser of the Ape-X paper: TensorFlow's centered RMSProp, whose update differs from PyTorch's.

TensorFlow 1's ``tf.train.RMSPropOptimizer(centered=True)``, which the Ape-X and DQN papers' settings refer to,
updates each parameter as::

    ms  = decay * ms + (1 - decay) * g^2          (ms starts at 1.0)
    mg  = decay * mg + (1 - decay) * g            (mg starts at 0.0)
    mom = momentum * mom + lr * g / sqrt(ms - mg^2 + eps)
    w  -= mom

PyTorch's ``RMSprop(centered=True)`` divides by ``sqrt(ms - mg^2) + eps`` instead, with ms starting at 0. With
the paper's eps = 1.5e-7 and gradients of the size an Atari network sees at batch 512 (|g| around 2.5e-6, so
ms - mg^2 around 6e-12), sqrt(v + eps) ~ 3.9e-4 while sqrt(v) + eps ~ 2.6e-6: the steps differ by two orders of
magnitude. :class:`TFRMSProp` is the TensorFlow update; ``DQNConfig.optimizer = "rmsprop_tf"`` selects it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

__all__ = ["TFRMSProp"]


class TFRMSProp(torch.optim.Optimizer):
    """TensorFlow 1's RMSProp (module docstring): ``lr``, ``decay``, ``momentum``, ``eps``, ``centered``
    (default True: the paper's), ``initial_ms`` (TensorFlow's 1.0). Per-parameter state: ``ms``, ``mg``
    (centered), ``mom`` (momentum > 0), all shaped like the parameter."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float,
        decay: float = 0.9,
        momentum: float = 0.0,
        eps: float = 1e-10,
        centered: bool = True,
        initial_ms: float = 1.0,
    ):
        for name, value, ok in (
            ("lr", lr, lr > 0),
            ("decay", decay, 0 <= decay < 1),
            ("momentum", momentum, momentum >= 0),
            ("eps", eps, eps > 0),
            ("initial_ms", initial_ms, initial_ms >= 0),
        ):
            if not (math.isfinite(value) and ok):
                raise ValueError(f"TFRMSProp: invalid {name} {value!r}")
        super().__init__(
            params, dict(lr=lr, decay=decay, momentum=momentum, eps=eps, centered=centered, initial_ms=initial_ms)
        )

    @torch.no_grad()
    def step(self, closure=None):  # torch's signature
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, decay, momentum, eps = group["lr"], group["decay"], group["momentum"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if not state:
                    state["ms"] = torch.full_like(p, group["initial_ms"], memory_format=torch.preserve_format)
                    if group["centered"]:
                        state["mg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if momentum > 0:
                        state["mom"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                ms = state["ms"]
                ms.mul_(decay).addcmul_(g, g, value=1 - decay)
                if group["centered"]:
                    mg = state["mg"]
                    mg.mul_(decay).add_(g, alpha=1 - decay)
                    denom = ms.addcmul(mg, mg, value=-1).add_(eps).sqrt_()
                else:
                    denom = ms.add(eps).sqrt_()
                if momentum > 0:
                    mom = state["mom"]
                    mom.mul_(momentum).addcdiv_(g, denom, value=lr)
                    p.sub_(mom)
                else:
                    p.addcdiv_(g, denom, value=-lr)
        return loss
