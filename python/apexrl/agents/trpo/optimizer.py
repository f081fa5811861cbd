"""TRPO's step, as Tonic's ``updaters.ConjugateGradient``: solve ``(H + damping I) x = g`` by conjugate gradient
(H: the Hessian of the mean KL, reached through Hessian-vector products), scale the step to the KL bound,
``alpha = sqrt(2 max_kl / x^T H x)``, then backtrack ``alpha x coeff^i`` until the KL stays within the bound and
the loss does not rise."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["LineSearch", "conjugate_gradient", "line_search", "trust_region_step"]

EPS = 1e-8


def conjugate_gradient(hvp: Callable[[np.ndarray], np.ndarray], b: np.ndarray, steps: int) -> np.ndarray | None:
    """``steps`` iterations of conjugate gradient on ``A x = b`` (A symmetric positive definite, given as its
    product ``hvp(v) = A v``), from x = 0; None when ``b`` is 0 (no direction to step in)."""
    x = np.zeros_like(b)
    r = b.copy()
    p = r.copy()
    rr = float(np.dot(r, r))
    if rr == 0:
        return None
    for _ in range(steps):
        z = hvp(p)
        alpha = rr / (float(np.dot(p, z)) + EPS)
        x += alpha * p
        r -= alpha * z
        rr_new = float(np.dot(r, r))
        if rr_new == 0:  # solved exactly: another step would divide by zero
            break
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


@dataclass(frozen=True)
class LineSearch:
    """The line search's outcome: the step fraction taken (0: none accepted, the start restored), the KL and the
    loss there, and the trials made."""

    fraction: float
    kl: float
    loss: float
    trials: int


def line_search(
    evaluate: Callable[[float], tuple[float, float]], start_loss: float, max_kl: float, steps: int, coeff: float
) -> LineSearch:
    """Try fractions ``coeff^i`` (i = 0 .. steps - 1) of the full step, ``evaluate(fraction) -> (kl, loss)``
    setting the parameters there; accept the first with ``kl <= max_kl`` and ``loss <= start_loss``. None
    accepted: ``evaluate(0)`` restores the start."""
    for i in range(steps):
        fraction = coeff**i
        kl, loss = evaluate(fraction)
        if kl <= max_kl and loss <= start_loss:
            return LineSearch(fraction, kl, loss, i + 1)
    kl, loss = evaluate(0.0)
    return LineSearch(0.0, kl, loss, steps)


def _flat(xs: Sequence[Tensor]) -> Tensor:
    return torch.cat([x.reshape(-1) for x in xs])


def _assign(flat: Tensor, params: Sequence[Tensor]) -> None:
    with torch.no_grad():
        i = 0
        for p in params:
            n = p.numel()
            p.copy_(flat[i : i + n].view_as(p))
            i += n


def trust_region_step(
    loss_fn: Callable[[], Tensor],
    kl_fn: Callable[[], Tensor],
    params: Sequence[Tensor],
    *,
    cg_steps: int,
    damping: float,
    max_kl: float,
    backtrack_steps: int,
    backtrack_coeff: float,
) -> LineSearch:
    """One TRPO step on ``params`` (module docstring); a zero gradient takes none."""
    params = list(params)
    start = _flat([p.detach() for p in params]).clone()
    loss = loss_fn()
    grad = _flat(torch.autograd.grad(loss, params)).double().numpy()
    start_loss = loss.item()

    def hvp(v: np.ndarray) -> np.ndarray:
        g = _flat(torch.autograd.grad(kl_fn(), params, create_graph=True))
        vt = torch.as_tensor(v, dtype=g.dtype)
        hv = _flat(torch.autograd.grad((g * vt).sum(), params)).double().numpy()
        return hv + damping * v

    x = conjugate_gradient(hvp, grad, cg_steps)
    if x is None:
        return LineSearch(0.0, 0.0, start_loss, 0)
    alpha = float(np.sqrt(2 * max_kl / (float(np.dot(x, hvp(x))) + EPS)))
    full = torch.as_tensor(alpha * x, dtype=start.dtype)

    def evaluate(fraction: float) -> tuple[float, float]:
        _assign(start - fraction * full, params)
        with torch.no_grad():
            return float(kl_fn()), float(loss_fn())

    return line_search(evaluate, start_loss, max_kl, backtrack_steps, backtrack_coeff)
