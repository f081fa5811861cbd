"""Names, dtypes and shapes of a dict of tensors, and one message for how two such dicts differ.

Used wherever named tensors cross a boundary: weights an actor receives (``apexrl.params.service``), the policy and
checkpoint dicts the agents load (``apexrl.agents``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["TensorSpec", "describe_mismatch", "spec_of"]

TensorSpec = dict[str, tuple[torch.dtype, tuple[int, ...]]]


def spec_of(tensors: Mapping[str, torch.Tensor]) -> TensorSpec:
    """``{name: (dtype, shape)}`` of a dict of tensors."""
    return {name: (t.dtype, tuple(t.shape)) for name, t in tensors.items()}


def describe_mismatch(expected: Mapping[str, tuple[torch.dtype, Any]], got: Mapping[str, Any]) -> str | None:
    """None when ``got`` holds exactly the ``expected`` names with those dtypes and shapes; otherwise one line
    naming every missing, unexpected and mismatched entry, e.g.
    ``missing ['a']; unexpected ['b']; mismatched c: got torch.float32 (3,), expected torch.float32 (4,)``."""
    problems = []
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    if missing:
        problems.append(f"missing {missing}")
    if unexpected:
        problems.append(f"unexpected {unexpected}")
    bad = []
    for name in sorted(set(expected) & set(got)):
        (dtype, shape), have = expected[name], got[name]
        if not isinstance(have, torch.Tensor):
            bad.append(f"{name}: expected a tensor, got {type(have).__name__}")
        elif tuple(have.shape) != tuple(shape) or have.dtype != dtype:
            bad.append(f"{name}: got {have.dtype} {tuple(have.shape)}, expected {dtype} {tuple(shape)}")
    if bad:
        problems.append("mismatched " + "; ".join(bad))
    return "; ".join(problems) if problems else None
