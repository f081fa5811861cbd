"""Observation normalisation for the continuous-control agents (DPG, D4PG, TD3, SAC): ``obs_norm=True``.

The learner keeps a running mean and variance of the observations and every network sees
``clip((s - mean) / sqrt(var + 1e-8), -5, 5)`` instead of ``s``. The statistics are buffers of an
:class:`ObsNormalizer` (``obs_norm/count``, ``obs_norm/mean``, ``obs_norm/var``, float64): they travel to the
actors with the weights (the parameter service's ``policy_state_dict``), so actors and evaluation normalise as
the learner does, and they are saved in checkpoints. With ``obs_norm=False`` (every existing preset) there is
no normaliser, no such entry in weights or checkpoints, and the networks see the raw observations.

Where the statistics come from: the batches the learner samples (their ``obs`` field), before each update.
The learner never sees inserted transitions -- actors send them straight to the replay server -- so sampled
batches are what it has. They follow the replay's prioritised distribution rather than the stream of
observations the actors meet; every sampled batch counts once (a transition sampled twice counts twice), which
weighs high-priority states a little more than a count over inserts would. The learner samples about as many
transitions as are inserted (or more) so the statistics track the replay's contents as it changes.

The update is Chan et al.'s parallel combination of (count, mean, M2) with a batch's, in float64: exact for
any batch size, with no drift over the 10^8 observations of a long run. Clipping at 5 standard deviations keeps
one outlier from saturating the tanh layers; before the first update (count 0) the normaliser passes
observations through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from apexrl.agents.common import load_module_tensors, module_layout, module_tensors

__all__ = [
    "CLIP",
    "EPS",
    "PREFIX",
    "ObsNormalizer",
    "apply",
    "load_norm",
    "make_obs_norm",
    "norm_layout",
    "norm_tensors",
]

CLIP = 5.0
"""Normalised observations are clipped to [-CLIP, CLIP]."""
EPS = 1e-8
"""Added to the variance before its square root."""
PREFIX = "obs_norm"
"""Name prefix of the normaliser's entries in weights and checkpoints."""


class ObsNormalizer(nn.Module):
    """Running mean and (population) variance of vector observations; ``forward`` normalises and clips."""

    count: Tensor
    mean: Tensor
    var: Tensor

    def __init__(self, obs_dim: int):
        super().__init__()
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(obs_dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(obs_dim, dtype=torch.float64))

    @torch.no_grad()
    def update(self, obs: Tensor) -> None:
        """Fold the rows of ``obs`` ``(B, obs_dim)`` into the statistics (Chan et al.'s parallel update)."""
        x = obs.detach().to(torch.float64).reshape(-1, self.mean.shape[0])
        n = x.shape[0]
        if n == 0:
            return
        b_mean = x.mean(dim=0)
        b_var = x.var(dim=0, unbiased=False)
        total = self.count + n
        delta = b_mean - self.mean
        m2 = self.var * self.count + b_var * n + delta.square() * self.count * n / total
        self.mean.add_(delta * n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, obs: Tensor) -> Tensor:
        if float(self.count) == 0.0:
            return obs
        mean = self.mean.to(obs.dtype)
        inv_std = torch.rsqrt(self.var + EPS).to(obs.dtype)
        return ((obs - mean) * inv_std).clamp(-CLIP, CLIP)


def make_obs_norm(obs_dim: int, enabled: bool, device: torch.device) -> ObsNormalizer | None:
    """A normaliser on ``device`` when ``enabled`` (the config's ``obs_norm``), else None."""
    return ObsNormalizer(obs_dim).to(device) if enabled else None


def norm_tensors(norm: ObsNormalizer | None) -> dict[str, Tensor]:
    """``{obs_norm/count, obs_norm/mean, obs_norm/var}`` as CPU copies; empty without a normaliser."""
    return {} if norm is None else module_tensors(PREFIX, norm)


def norm_layout(norm: ObsNormalizer | None) -> dict[str, Tensor]:
    """What :func:`norm_tensors` gives, as meta tensors (for checking weights and checkpoints)."""
    return {} if norm is None else module_layout(PREFIX, norm)


def load_norm(norm: ObsNormalizer | None, d: Mapping[str, Tensor]) -> None:
    """Load the (already checked) ``obs_norm/...`` entries of ``d``."""
    if norm is not None:
        load_module_tensors(PREFIX, norm, d)


def apply(norm: ObsNormalizer | None, obs: Tensor) -> Tensor:
    """``norm(obs)``, or ``obs`` itself without a normaliser."""
    return obs if norm is None else norm(obs)
