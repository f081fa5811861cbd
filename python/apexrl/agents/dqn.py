"""Ape-X DQN (Horgan et al. 2018): dueling network, double-Q n-step targets, prioritized replay.

Network (Wang et al. 2016)::

    Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a')

on the Nature-DQN torso for uint8 frame stacks (each stream: 512 ReLU units, then linear) or on an MLP torso
for vector observations (linear streams).

Learner update on a sampled batch (s, a, R, D, s') with IS weights w, where R is the n-step return and D holds
gamma^n (0 when the episode terminated, see apexrl.apex.nstep)::

    a*         = argmax_a Q_online(s', a)                    double Q: the online net picks,
    td_target  = R + D * Q_target(s', a*)                    the target net evaluates
    delta      = td_target - Q_online(s, a)
    loss       = mean_i w_i * l(delta_i)      l(x) = x^2 / 2 (paper, default) or Huber(x; huber_delta)
    priorities = |delta| + priority_eps

Loss choice: the paper's loss is the squared n-step TD error, l(x) = x^2 / 2, with the global gradient norm
clipped to 40; that is the default. ``DQNConfig.huber_delta`` switches to the Huber loss (acme's Ape-X-style
DQN uses Huber with delta 1), which bounds each sample's gradient to ``w_i * huber_delta``.
Optimiser: centered RMSProp (lr 0.00025/4, decay 0.95, eps 1.5e-7): PyTorch's by default, TensorFlow's -- the
paper's -- with ``optimizer="rmsprop_tf"`` (the ``apex-dqn-atari`` preset; apexrl.agents.optim). The target net is a hard copy of the
online net after every ``target_update_period``-th update.

Actors (``DQNPolicy``) act epsilon-greedily with a fixed epsilon (``epsilon_ladder``) and compute initial
priorities with their local copy of the online network standing in for both the online and the target
network (they have no target net), so their target reduces to ``R + D * max_a Q(s', a)``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from apexrl.agents.base import AgentDef
from apexrl.agents.common import (
    as_tensor,
    check_batch,
    check_steps,
    check_tensors,
    epsilon_ladder,
    expected_optimizer_tensors,
    finite_priorities,
    load_module_tensors,
    load_optimizer_tensors,
    module_layout,
    module_tensors,
    optimizer_tensors,
)
from apexrl.agents.config import DQNConfig
from apexrl.agents.optim import TFRMSProp
from apexrl.agents.validity import finite, in_range, invalid_items
from apexrl.nets import MLP, NatureTorso, build_seeded
from apexrl.replay.wire.codec import FieldSpec, TransitionSpec

if TYPE_CHECKING:
    from apexrl.envs import EnvSpec

__all__ = ["DQNLearner", "DQNPolicy", "DuelingQNetwork", "dqn_transition_spec", "make_q_network"]


class DuelingQNetwork(nn.Module):
    """``Q(s, .) = V(s) + A(s, .) - mean_a A(s, a)`` on top of ``torso``.

    Args:
      torso: observations -> features of size ``feature_dim``.
      num_actions: size of the advantage stream's output.
      stream_hidden: hidden ReLU layers of each stream (``()``: linear streams).
    """

    def __init__(self, torso: nn.Module, feature_dim: int, num_actions: int, stream_hidden: tuple[int, ...] = ()):
        super().__init__()
        self.torso = torso
        self.value = MLP(feature_dim, stream_hidden, 1)
        self.advantage = MLP(feature_dim, stream_hidden, num_actions)

    def forward(self, obs: Tensor) -> Tensor:
        h = self.torso(obs)
        value, advantage = self.value(h), self.advantage(h)
        return value + advantage - advantage.mean(dim=1, keepdim=True)


def _is_image(env_spec: EnvSpec) -> bool:
    return len(env_spec.obs_shape) == 3 and np.dtype(env_spec.obs_dtype) == np.uint8


def _check_env(env_spec: EnvSpec) -> None:
    if not env_spec.num_actions or env_spec.num_actions < 1:
        raise ValueError(f"DQN needs a discrete action space; {env_spec.name} has num_actions={env_spec.num_actions}")
    if not (_is_image(env_spec) or len(env_spec.obs_shape) == 1):
        raise ValueError(
            f"DQN handles uint8 (C, H, W) frames or vector observations; {env_spec.name} has "
            f"{np.dtype(env_spec.obs_dtype)} {env_spec.obs_shape}"
        )


def make_q_network(env_spec: EnvSpec, config: DQNConfig) -> DuelingQNetwork:
    """The dueling Q network for ``env_spec`` (parameters on the meta device until ``build_seeded``)."""
    _check_env(env_spec)
    if _is_image(env_spec):
        torso = NatureTorso(cast(tuple[int, int, int], tuple(env_spec.obs_shape)))  # _is_image: (C, H, W)
        return DuelingQNetwork(torso, torso.out_features, _num_actions(env_spec), (config.atari_stream_hidden,))
    mlp = MLP(env_spec.obs_shape[0], config.hidden)
    return DuelingQNetwork(mlp, mlp.out_features, _num_actions(env_spec))


def _num_actions(env_spec: EnvSpec) -> int:
    """The action count of an environment ``_check_env`` accepted (discrete, so it has one)."""
    assert env_spec.num_actions is not None
    return env_spec.num_actions


def dqn_transition_spec(env_spec: EnvSpec) -> TransitionSpec:
    """Frames: ``TransitionSpec.atari`` (lz4 uint8 stacks); vectors: float32 obs, int32 action, no compression."""
    _check_env(env_spec)
    if _is_image(env_spec):
        return TransitionSpec.atari(*env_spec.obs_shape)
    d = env_spec.obs_shape[0]
    return TransitionSpec(
        [
            FieldSpec("obs", "f4", (d,)),
            FieldSpec("action", "i4"),
            FieldSpec("reward", "f4"),
            FieldSpec("discount", "f4"),
            FieldSpec("next_obs", "f4", (d,)),
        ]
    )


def _obs_tensor(x: np.ndarray, device: torch.device) -> Tensor:
    # uint8 frames travel as uint8 (the torso scales them); anything else becomes float32.
    return as_tensor(x, device, None if x.dtype == np.uint8 else torch.float32)


class DQNLearner:
    """The learner's side of Ape-X DQN: online and target dueling networks, centered RMSProp.

    Args:
      env_spec: the environment (obs shape/dtype, number of actions).
      config: hyper-parameters (paper defaults).
      device: torch device of the networks and the update.
      seed: initialises the networks (through a torch.Generator; the global RNG is not used).
    """

    metric_names: tuple[str, ...] = ("loss", "td_abs_mean", "q_mean", "grad_norm")
    """Keys of the metrics dict ``update`` returns (columns of the learner's metrics.csv)."""

    def __init__(
        self, env_spec: EnvSpec, config: DQNConfig | None = None, device: str | torch.device = "cpu", seed: int = 0
    ):
        self.config = config = config or DQNConfig()
        self.env_spec = env_spec
        self.device = torch.device(device)
        self.transition_spec = dqn_transition_spec(env_spec)
        generator = torch.Generator().manual_seed(seed)
        self.q_net = build_seeded(lambda: make_q_network(env_spec, config), generator, self.device)
        self.target_q_net = copy.deepcopy(self.q_net).requires_grad_(False)
        self.optimizer = _optimizer(self.q_net.parameters(), config)
        self.steps = 0
        self._rules = (
            in_range("action", 0, _num_actions(env_spec) - 1),
            finite("reward"),
            in_range("discount", 0, 1),
            finite("obs"),
            finite("next_obs"),
        )

    def invalid_items(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray | None, str | None]:
        """Items ``update`` must not see: an action without a Q output (outside [0, num_actions)), a non-finite
        reward or observation, a discount outside [0, 1] (it is gamma^n or 0)."""
        return invalid_items(batch, self._rules)

    def _td_loss(self, delta: Tensor, weights: Tensor) -> Tensor:
        """mean_i w_i * l(delta_i) with l the squared (1/2 x^2) or Huber loss."""
        if self.config.huber_delta is None:
            per_sample = 0.5 * delta.square()
        else:
            per_sample = F.huber_loss(delta, torch.zeros_like(delta), reduction="none", delta=self.config.huber_delta)
        return (weights * per_sample).mean()

    def update(self, batch: Mapping[str, np.ndarray], weights: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        """One gradient step on a sampled batch with IS weights (formulas in the module docstring).

        Returns the new priorities ``|delta| + priority_eps`` (float64) and the metrics ``loss``,
        ``td_abs_mean``, ``q_mean`` (mean Q_online(s, a)) and ``grad_norm`` (before clipping), all computed
        before the step. Copies the target network after every ``target_update_period``-th update.
        """
        check_batch(batch, self.transition_spec.names, weights)
        dev = self.device
        obs, next_obs = _obs_tensor(batch["obs"], dev), _obs_tensor(batch["next_obs"], dev)
        action = as_tensor(batch["action"], dev, torch.int64)
        reward = as_tensor(batch["reward"], dev, torch.float32)
        discount = as_tensor(batch["discount"], dev, torch.float32)
        w = as_tensor(weights, dev, torch.float32)

        with torch.no_grad():
            a_star = self.q_net(next_obs).argmax(dim=1, keepdim=True)
            q_next_target = self.target_q_net(next_obs).gather(1, a_star).squeeze(1)
            td_target = reward + discount * q_next_target
        q = self.q_net(obs).gather(1, action.unsqueeze(1)).squeeze(1)
        delta = td_target - q
        loss = self._td_loss(delta, w)

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        max_norm = self.config.grad_clip_norm if self.config.grad_clip_norm is not None else float("inf")
        grad_norm = nn.utils.clip_grad_norm_(self.q_net.parameters(), max_norm)
        self.optimizer.step()

        self.steps += 1
        if self.steps % self.config.target_update_period == 0:
            self.target_q_net.load_state_dict(self.q_net.state_dict())

        td_abs = delta.detach().abs()
        stats = torch.stack([loss.detach(), td_abs.mean(), q.detach().mean(), grad_norm.detach()]).tolist()
        metrics = dict(zip(self.metric_names, stats))
        return finite_priorities(td_abs, self.config.priority_eps), metrics

    # -- weights for actors, checkpoints ---------------------------------------------------------------------

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """The online network's weights as CPU tensors named ``q_net/...``: what ``DQNPolicy`` loads."""
        return module_tensors("q_net", self.q_net)

    def policy_modules(self) -> dict[str, nn.Module]:
        """The live network the policy acts with, under its :meth:`policy_state_dict` prefix."""
        return {"q_net": self.q_net}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat checkpoint: ``q_net/*``, ``target_q_net/*``, ``optim/q_net/<i>/<key>``, ``steps`` (int64)."""
        return {
            **module_tensors("q_net", self.q_net),
            **module_tensors("target_q_net", self.target_q_net),
            **optimizer_tensors("q_net", self.optimizer),
            "steps": torch.tensor(self.steps, dtype=torch.int64),
        }

    def _expected_state(self, present: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {
            **module_layout("q_net", self.q_net),
            **module_layout("target_q_net", self.target_q_net),
            **expected_optimizer_tensors("q_net", self.optimizer, present),
            "steps": torch.tensor(0, dtype=torch.int64),
        }

    def load_state_dict(self, d: Mapping[str, torch.Tensor]) -> None:
        """Restore a ``state_dict``; ValueError naming missing/unexpected/mismatched entries changes nothing."""
        check_tensors(self._expected_state(d) if isinstance(d, Mapping) else {}, d, "DQN checkpoint")
        check_steps(d["steps"])
        load_module_tensors("q_net", self.q_net, d)
        load_module_tensors("target_q_net", self.target_q_net, d)
        self.optimizer = type(self.optimizer)(self.q_net.parameters(), **_hyper(self.optimizer))
        load_optimizer_tensors("q_net", self.optimizer, d)
        self.steps = int(d["steps"])  # checked >= 0 above


def _optimizer(params, config: DQNConfig) -> torch.optim.Optimizer:
    """Centered RMSProp as the config says: PyTorch's, or TensorFlow's (the paper's; apexrl.agents.optim)."""
    if config.optimizer == "rmsprop_tf":
        return TFRMSProp(params, lr=config.lr, decay=config.rms_decay, eps=config.rms_eps, centered=config.rms_centered)
    return torch.optim.RMSprop(
        params, lr=config.lr, alpha=config.rms_decay, eps=config.rms_eps, centered=config.rms_centered
    )


def _hyper(opt: torch.optim.Optimizer) -> dict:
    return {k: v for k, v in opt.param_groups[0].items() if k != "params"}


class DQNPolicy:
    """An actor's local Ape-X DQN policy: epsilon-greedy on its copy of the online network.

    Args:
      env_spec, config: as for the learner (same network).
      epsilon: this actor's exploration rate (``epsilon_ladder(i, n)``); None: ``config.epsilon_base``.
      seed: initial weights (until the first ``load_policy_state_dict``) and the exploration draws.
      device: torch device of the local network (actors normally run on the CPU).
    """

    def __init__(
        self,
        env_spec: EnvSpec,
        config: DQNConfig | None = None,
        *,
        epsilon: float | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
        epsilons: Sequence[float] | None = None,
    ):
        self.config = config = config or DQNConfig()
        self.env_spec = env_spec
        self._num_actions = _num_actions(env_spec)
        self.device = torch.device(device)
        if epsilons is not None and epsilon is None:
            epsilon = epsilons[0]
        self.epsilon = float(config.epsilon_base if epsilon is None else epsilon)
        self.epsilons = np.asarray([self.epsilon] if epsilons is None else epsilons, np.float64)
        """One epsilon per environment of a vectorised actor (``act_batch``)."""
        if not (0.0 <= self.epsilon <= 1.0 and np.all((self.epsilons >= 0) & (self.epsilons <= 1))):
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r} / {epsilons!r}")
        self.transition_spec = dqn_transition_spec(env_spec)
        generator = torch.Generator().manual_seed(seed)
        self.q_net = build_seeded(lambda: make_q_network(env_spec, config), generator, self.device)
        self.q_net.requires_grad_(False)
        self.rng = np.random.default_rng(seed)

    @property
    def exploration(self) -> float:
        """This actor's epsilon: smaller is greedier (``apexrl plot`` picks the greediest actor by it)."""
        return self.epsilon

    @property
    def explorations(self) -> list[float]:
        return self.epsilons.tolist()

    def act_batch(self, obs: np.ndarray, explore: bool = True) -> list[int]:
        """Epsilon-greedy actions for a stack of observations, one per environment, in one forward pass:
        environment ``j`` explores with ``epsilons[j]`` (``explore=False``: ``config.eval_epsilon`` for all)."""
        return self.act_batch_values(obs, explore)[0]

    @torch.inference_mode()
    def act_batch_values(self, obs: np.ndarray, explore: bool = True) -> tuple[list[int], np.ndarray]:
        """``act_batch``'s actions and the Q-values of that forward pass, (K, num_actions) float32: a vectorised
        actor keeps them to score its transitions (``priorities_from_values``) without another forward pass."""
        obs = np.asarray(obs)
        k = len(obs)
        if explore and k != len(self.epsilons):
            raise ValueError(f"{k} observations for {len(self.epsilons)} epsilons")
        eps = self.epsilons if explore else np.full(k, self.config.eval_epsilon)
        q = self.q_net(_obs_tensor(obs, self.device))
        greedy = q.argmax(dim=1).cpu().numpy()
        random = self.rng.random(k) < eps
        actions = np.where(random, self.rng.integers(self._num_actions, size=k), greedy)
        return [int(a) for a in actions], q.cpu().numpy()

    @torch.inference_mode()
    def values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values of a stack of observations, (M, num_actions) float32 (observations never acted on: the last
        one of an episode, the open ones at a stop)."""
        return self.q_net(_obs_tensor(np.asarray(obs), self.device)).cpu().numpy()

    @torch.inference_mode()
    def priorities_from_values(
        self, batch: Mapping[str, np.ndarray], obs_values: np.ndarray, next_values: np.ndarray
    ) -> np.ndarray:
        """``initial_priorities`` from Q-values already computed (``act_batch_values``, ``values``) of the
        batch's ``obs`` and ``next_obs``, in the same float32 arithmetic: the same priorities when the weights
        are those the values came from. ``batch`` needs ``action``, ``reward`` and ``discount`` only."""
        dev = self.device
        q = torch.as_tensor(obs_values, device=dev)
        q = q.gather(1, as_tensor(batch["action"], dev, torch.int64).unsqueeze(1)).squeeze(1)
        q_next = torch.as_tensor(next_values, device=dev).max(dim=1).values
        reward = as_tensor(batch["reward"], dev, torch.float32)
        td_target = reward + as_tensor(batch["discount"], dev, torch.float32) * q_next
        return finite_priorities((td_target - q).abs(), self.config.priority_eps)

    @torch.inference_mode()
    def act(self, obs: np.ndarray, explore: bool = True) -> int:
        """Epsilon-greedy action for one observation; ``explore=False`` uses ``config.eval_epsilon`` (0.001,
        the evaluation protocol) instead of the actor's epsilon."""
        eps = self.epsilon if explore else self.config.eval_epsilon
        if eps > 0 and self.rng.random() < eps:
            return int(self.rng.integers(self._num_actions))
        q = self.q_net(_obs_tensor(np.asarray(obs)[None], self.device))
        return int(q.argmax(dim=1).item())

    @torch.inference_mode()
    def initial_priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """``|R + D * Q(s', argmax_a Q(s', a)) - Q(s, a)| + priority_eps`` with the local network as both online
        and target network, for a whole batch at once (float64)."""
        check_batch(batch, self.transition_spec.names)
        dev = self.device
        q = self.q_net(_obs_tensor(batch["obs"], dev))
        q = q.gather(1, as_tensor(batch["action"], dev, torch.int64).unsqueeze(1)).squeeze(1)
        q_next = self.q_net(_obs_tensor(batch["next_obs"], dev)).max(dim=1).values
        reward = as_tensor(batch["reward"], dev, torch.float32)
        td_target = reward + as_tensor(batch["discount"], dev, torch.float32) * q_next
        return finite_priorities((td_target - q).abs(), self.config.priority_eps)

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        return module_tensors("q_net", self.q_net)

    def load_policy_state_dict(self, d: Mapping[str, torch.Tensor]) -> None:
        """Load the learner's ``policy_state_dict``; ValueError naming wrong names/shapes changes nothing."""
        check_tensors(module_layout("q_net", self.q_net), d, "DQN policy weights")
        load_module_tensors("q_net", self.q_net, d)


def _policy(env_spec: EnvSpec, config: DQNConfig, index: int, num_actors: int, seed: int) -> DQNPolicy:
    """Actor ``index`` of ``num_actors`` explores with the Ape-X epsilon ladder."""
    eps = epsilon_ladder(index, num_actors, config.epsilon_base, config.epsilon_alpha)
    return DQNPolicy(env_spec, config, epsilon=eps, seed=seed)


def _batch_policy(env_spec: EnvSpec, config: DQNConfig, slots: Sequence[int], num_slots: int, seed: int) -> DQNPolicy:
    """A vectorised actor's environments take the epsilon ladder's rungs ``slots`` of ``num_slots``."""
    eps = [epsilon_ladder(s, num_slots, config.epsilon_base, config.epsilon_alpha) for s in slots]
    return DQNPolicy(env_spec, config, epsilons=eps, seed=seed)


AGENT = AgentDef(
    name="dqn",
    description="Ape-X DQN: dueling double-Q network, n-step targets (discrete actions)",
    config_class=DQNConfig,
    check_env=_check_env,
    make_learner=lambda env_spec, config, device, seed: DQNLearner(env_spec, config, device=device, seed=seed),
    make_policy=_policy,
    make_batch_policy=_batch_policy,
)
