"""Seeded construction: every weight comes from a ``torch.Generator`` made from the caller's seed.

PyTorch's modules initialise themselves from the global RNG. :func:`build_seeded` builds the module on the meta
device (no memory, no global RNG draws), materialises it on the CPU and fills every Linear/Conv2d with
PyTorch's default scheme (``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` for weight and bias, which is what
``kaiming_uniform_(a=sqrt(5))`` amounts to) drawn from its own generator. Same seed, same weights, and the global
RNG is never touched.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def reinit_(module: nn.Module, generator: torch.Generator) -> None:
    """Re-draw the parameters of every Linear and Conv2d in ``module`` (in module order) from ``generator``."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                fan_in = m.weight[0].numel()
                bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
                m.weight.uniform_(-bound, bound, generator=generator)
                if m.bias is not None:
                    m.bias.uniform_(-bound, bound, generator=generator)


def build_seeded(factory: Callable[[], M], generator: torch.Generator, device: torch.device | str = "cpu") -> M:
    """``factory()`` built without drawing from the global RNG, initialised from ``generator`` (a CPU generator),
    then moved to ``device``. Modules may adjust their own init afterwards in ``reset_from(generator)``."""
    with torch.device("meta"):
        module = factory()
    module = module.to_empty(device="cpu")
    reinit_(module, generator)
    extra = getattr(module, "reset_from", None)
    if callable(extra):
        extra(generator)
    return module.to(device)
