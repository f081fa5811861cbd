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
import os
from collections.abc import Iterable

import torch

__all__ = ["FUSED_ADAM_ENV", "TFRMSProp", "fused_adam_works", "make_adam"]


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


FUSED_ADAM_ENV = "APEXRL_FUSED_ADAM"
"""Environment variable: ``0`` turns fused Adam off (read at each :func:`make_adam`)."""

_FUSED_OK: dict[str, bool] = {}
"""Whether ``Adam(fused=True)`` stepped on a device type, found once per process by :func:`fused_adam_works`."""


def fused_adam_works(device_type: str) -> bool:
    """True when ``torch.optim.Adam(fused=True)`` takes a step on ``device_type`` in this torch (tried once on a
    2-element probe: older torch builds refuse fused Adam on the CPU with a RuntimeError)."""
    if device_type not in _FUSED_OK:
        try:
            probe = torch.zeros(2, device=device_type, requires_grad=True)
            opt = torch.optim.Adam([probe], lr=1e-3, fused=True)
            probe.grad = torch.ones(2, device=device_type)
            opt.step()
            _FUSED_OK[device_type] = bool(torch.isfinite(probe).all())
        except (RuntimeError, TypeError, ValueError):
            _FUSED_OK[device_type] = False
    return _FUSED_OK[device_type]


def make_adam(params: Iterable[torch.Tensor], lr: float, eps: float) -> torch.optim.Adam:
    """``torch.optim.Adam`` over ``params``, fused (one kernel for every parameter's update instead of a loop
    of small ones) where this torch supports it on their device, the plain for-each implementation otherwise.
    Both compute the same update; their state (``step``, ``exp_avg``, ``exp_avg_sq``) has the same names,
    shapes and dtypes, so checkpoints load into either. ``APEXRL_FUSED_ADAM=0`` in the environment: the plain
    one (bench/bench_learner_step.py compares them)."""
    params = list(params)
    device_type = params[0].device.type if params else "cpu"
    if os.environ.get(FUSED_ADAM_ENV, "1") != "0" and fused_adam_works(device_type):
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
    return torch.optim.Adam(params, lr=lr, eps=eps)
