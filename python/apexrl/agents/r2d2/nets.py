"""R2D2's network and value rescaling.

Network (Kapturowski et al. 2019, on Wang et al. 2016's dueling heads)::

    x_t        = torso(obs_t)                     Nature-DQN conv torso (uint8 frames) or an MLP (vectors)
    h_t, c_t   = LSTM(x_t, (h_{t-1}, c_{t-1}))    one layer of ``lstm_size`` units
    Q(., a)    = V(h_t) + A(h_t, a) - mean_a' A(h_t, a')

each dueling stream a ``stream_hidden`` ReLU layer then a linear output. The network's Q-values live in the
rescaled space: the learner's targets are ``h(r + gamma h^-1(Q'))`` (:func:`value_rescale`,
:func:`inverse_value_rescale`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from torch import Tensor, nn

from apexrl.agents.r2d2.config import R2D2Config
from apexrl.nets import MLP, NatureTorso

if TYPE_CHECKING:
    from apexrl.envs import EnvSpec

__all__ = ["RecurrentQNetwork", "inverse_value_rescale", "make_recurrent_q_network", "value_rescale"]

LSTMState = tuple[Tensor, Tensor]
"""(h, c), each (B, lstm_size)."""


def value_rescale(x: Tensor, eps: float = 1e-3) -> Tensor:
    """``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x`` (Pohlen et al. 2018; R2D2), elementwise."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def inverse_value_rescale(x: Tensor, eps: float = 1e-3) -> Tensor:
    """The exact inverse of :func:`value_rescale`::

        h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)

    (solving the quadratic of h for |x|). Computed in float64 inside and returned in ``x``'s dtype: in float32
    the difference of the square root and 1 loses digits for small eps."""
    d = x.to(torch.float64)
    root = torch.sqrt(1.0 + 4.0 * eps * (d.abs() + 1.0 + eps))
    out = torch.sign(d) * (((root - 1.0) / (2.0 * eps)).square() - 1.0)
    return out.to(x.dtype)


class RecurrentQNetwork(nn.Module):
    """``torso -> LSTM -> dueling heads`` over sequences.

    Args:
      torso: observations (N, *obs_shape) -> features (N, feature_dim).
      feature_dim: the torso's output size.
      num_actions: size of the advantage stream's output.
      lstm_size: LSTM units.
      stream_hidden: hidden ReLU layers of each dueling stream.
    """

    def __init__(
        self, torso: nn.Module, feature_dim: int, num_actions: int, lstm_size: int, stream_hidden: tuple[int, ...]
    ):
        super().__init__()
        self.torso = torso
        self.lstm = nn.LSTM(feature_dim, lstm_size, batch_first=True)
        self.value = MLP(lstm_size, stream_hidden, 1)
        self.advantage = MLP(lstm_size, stream_hidden, num_actions)
        self.lstm_size = lstm_size
        self.num_actions = num_actions

    def reset_from(self, generator: torch.Generator) -> None:
        """Draws the LSTM's weights and biases from ``generator`` as PyTorch's own LSTM init does,
        ``U(-1/sqrt(lstm_size), 1/sqrt(lstm_size))`` (``apexrl.nets.build_seeded`` calls this; it fills only
        Linear and Conv2d layers itself)."""
        bound = 1.0 / math.sqrt(self.lstm_size)
        with torch.no_grad():
            for p in self.lstm.parameters():
                p.uniform_(-bound, bound, generator=generator)

    def initial_state(self, batch: int, device: torch.device | str = "cpu") -> LSTMState:
        """Zeros: the state at an episode's first step."""
        z = torch.zeros(batch, self.lstm_size, device=device)
        return z, z.clone()

    def forward(self, obs: Tensor, state: LSTMState) -> tuple[Tensor, LSTMState]:
        """``obs`` (B, T, *obs_shape) from ``state`` (h, c) (B, lstm_size each) -> Q (B, T, num_actions) and the
        state after step T - 1."""
        b, t = obs.shape[:2]
        x = self.torso(obs.reshape(b * t, *obs.shape[2:])).reshape(b, t, -1)
        h0, c0 = state
        out, (h, c) = self.lstm(x, (h0.unsqueeze(0).contiguous(), c0.unsqueeze(0).contiguous()))
        value, advantage = self.value(out), self.advantage(out)
        q = value + advantage - advantage.mean(dim=-1, keepdim=True)
        return q, (h.squeeze(0), c.squeeze(0))


def _is_image(env_spec: EnvSpec) -> bool:
    return len(env_spec.obs_shape) == 3 and np.dtype(env_spec.obs_dtype) == np.uint8


def check_env(env_spec: EnvSpec) -> None:
    """ValueError unless the environment has discrete actions and uint8 (C, H, W) frames or vector observations."""
    if not env_spec.num_actions or env_spec.num_actions < 1:
        raise ValueError(f"R2D2 needs a discrete action space; {env_spec.name} has num_actions={env_spec.num_actions}")
    if not (_is_image(env_spec) or len(env_spec.obs_shape) == 1):
        raise ValueError(
            f"R2D2 handles uint8 (C, H, W) frames or vector observations; {env_spec.name} has "
            f"{np.dtype(env_spec.obs_dtype)} {env_spec.obs_shape}"
        )


def make_recurrent_q_network(env_spec: EnvSpec, config: R2D2Config) -> RecurrentQNetwork:
    """The network for ``env_spec``: Nature torso + LSTM + dueling heads on frames, MLP torso + LSTM + dueling
    heads on vectors (parameters on the meta device until ``build_seeded``)."""
    check_env(env_spec)
    assert env_spec.num_actions is not None  # check_env
    torso: nn.Module
    if _is_image(env_spec):
        nature = NatureTorso(cast(tuple[int, int, int], tuple(env_spec.obs_shape)))
        torso, features = nature, nature.out_features
    else:
        mlp = MLP(env_spec.obs_shape[0], config.hidden)
        torso, features = mlp, mlp.out_features
    return RecurrentQNetwork(torso, features, env_spec.num_actions, config.lstm_size, (config.stream_hidden,))
