"""R2D2's actor side: a recurrent epsilon-greedy policy for the K environments of a vectorised actor.

It carries one LSTM state per environment across steps and acts for all K with one batched forward pass of one
step. An environment's state is zeroed when its episode starts (``first[j]``). Each step's *input* state -- the
state the network held when it acted on that step's observation -- is returned with the actions
(:meth:`RecurrentPolicy.act_batch_state`; :meth:`RecurrentPolicy.act_batch_extras` hands it to the actor as each
step's extras): a sequence adder stores it as ``state_h``/``state_c`` with the item whose first step that is
(apexrl.agents.r2d2.sequences).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from apexrl.agents.common import (
    as_tensor,
    check_tensors,
    epsilon_ladder,
    finite_priorities,
    load_module_tensors,
    module_layout,
    module_tensors,
)
from apexrl.agents.r2d2.config import R2D2Config
from apexrl.agents.r2d2.learner import sequence_loss, sequences_to_tensors
from apexrl.agents.r2d2.nets import make_recurrent_q_network
from apexrl.agents.r2d2.sequences import check_sequences
from apexrl.nets import build_seeded

if TYPE_CHECKING:
    from apexrl.envs import EnvSpec

__all__ = ["RecurrentPolicy", "recurrent_batch_policy"]


class RecurrentPolicy:
    """Epsilon-greedy on a local copy of the online recurrent network, for K environments at once.

    Args:
      env_spec, config: as for the learner (same network).
      epsilons: one exploration rate per environment (``recurrent_batch_policy`` takes them from the Ape-X
        ladder); its length is K. None: one environment exploring with ``config.epsilon_base``.
      seed: initial weights (until the first ``load_policy_state_dict``) and the exploration draws.
      device: torch device of the local network (actors normally run on the CPU).

    Usage: ``actions, (h, c) = policy.act_batch_state(obs, first)`` each step, ``first[j]`` True when ``obs[j]``
    is the first observation of an episode (every environment at the first call). ``h[j], c[j]`` is the state
    environment j's step started from.
    """

    def __init__(
        self,
        env_spec: EnvSpec,
        config: R2D2Config | None = None,
        *,
        epsilons: Sequence[float] | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ):
        self.config = config = config or R2D2Config()
        self.env_spec = env_spec
        self.device = torch.device(device)
        self.epsilons = np.asarray([config.epsilon_base] if epsilons is None else list(epsilons), np.float64)
        if self.epsilons.ndim != 1 or len(self.epsilons) < 1:
            raise ValueError(f"epsilons must be a non-empty sequence, got {epsilons!r}")
        if not np.all((self.epsilons >= 0) & (self.epsilons <= 1)):
            raise ValueError(f"epsilons must be in [0, 1], got {epsilons!r}")
        generator = torch.Generator().manual_seed(seed)
        self.q_net = build_seeded(lambda: make_recurrent_q_network(env_spec, config), generator, self.device)
        self.q_net.requires_grad_(False)
        assert env_spec.num_actions is not None  # make_recurrent_q_network checked it
        self._num_actions = env_spec.num_actions
        self.rng = np.random.default_rng(seed)
        self.num_envs = len(self.epsilons)
        self._h, self._c = self.q_net.initial_state(self.num_envs, self.device)

    @property
    def exploration(self) -> float:
        """The first environment's epsilon (smaller is greedier)."""
        return float(self.epsilons[0])

    @property
    def explorations(self) -> list[float]:
        """One epsilon per environment."""
        return self.epsilons.tolist()

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the current state (h, c), (K, lstm_size) float32 each: what the next step starts from
        (before any reset that step's ``first`` asks for)."""
        return self._h.cpu().numpy().copy(), self._c.cpu().numpy().copy()

    @torch.inference_mode()
    def reset(self, envs: Sequence[int] | np.ndarray | None = None) -> None:
        """Zero the state of environments ``envs`` (indices or a (K,) bool mask; None: all)."""
        if envs is None:
            self._h.zero_()
            self._c.zero_()
            return
        idx = np.asarray(envs)
        if idx.dtype == bool:
            if idx.shape != (self.num_envs,):
                raise ValueError(f"a reset mask of shape {idx.shape} for {self.num_envs} environments")
            idx = np.flatnonzero(idx)
        if len(idx):
            sel = torch.as_tensor(idx, dtype=torch.int64, device=self.device)
            self._h[sel] = 0.0
            self._c[sel] = 0.0

    @torch.inference_mode()
    def act_batch_values(
        self, obs: np.ndarray, first: np.ndarray | Sequence[bool] | None = None, explore: bool = True
    ) -> tuple[list[int], np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """One step of every environment: the actions, the Q-values of this forward pass (K, num_actions) and
        the input state (h, c) of the step (K, lstm_size each). ``first[j]``: zero environment j's state first.
        ``explore=False``: ``config.eval_epsilon`` for every environment."""
        obs = np.asarray(obs)
        k = len(obs)
        if k != self.num_envs:
            raise ValueError(f"{k} observations for {self.num_envs} environments")
        if first is not None:
            self.reset(np.asarray(first, dtype=bool))
        state_in = self.state()
        x = as_tensor(obs, self.device, None if obs.dtype == np.uint8 else torch.float32).unsqueeze(1)
        q, (self._h, self._c) = self.q_net(x, (self._h, self._c))
        q = q.squeeze(1)
        eps = self.epsilons if explore else np.full(k, self.config.eval_epsilon)
        greedy = q.argmax(dim=1).cpu().numpy()
        random = self.rng.random(k) < eps
        actions = np.where(random, self.rng.integers(self._num_actions, size=k), greedy)
        return [int(a) for a in actions], q.cpu().numpy(), state_in

    def act_batch_state(
        self, obs: np.ndarray, first: np.ndarray | Sequence[bool] | None = None, explore: bool = True
    ) -> tuple[list[int], tuple[np.ndarray, np.ndarray]]:
        """``act_batch_values`` without the Q-values: the actions and the step's input state."""
        actions, _, state_in = self.act_batch_values(obs, first, explore)
        return actions, state_in

    def act_batch_extras(
        self, obs: np.ndarray, first: np.ndarray | Sequence[bool], explore: bool = True
    ) -> tuple[list[int], list[dict[str, np.ndarray]]]:
        """The actor's step on a sequence path: the actions and, per environment, the extras its adder stores
        with the step -- the state the step started from, ``state_h``/``state_c`` (an item keeps its first
        step's: what the learner unrolls from)."""
        actions, (h, c) = self.act_batch_state(obs, first, explore)
        return actions, [{"state_h": h[j], "state_c": c[j]} for j in range(len(actions))]

    def act_batch(self, obs: np.ndarray, explore: bool = True) -> list[int]:
        """The ``Policy`` protocol's batched action: the state carries on (call ``reset`` at episode starts)."""
        return self.act_batch_values(obs, None, explore)[0]

    def act(self, obs: np.ndarray, explore: bool = True) -> int:
        """One environment's action (K = 1: an evaluation process); call ``reset()`` at each episode's start."""
        if self.num_envs != 1:
            raise ValueError(f"act() is for one environment; this policy steps {self.num_envs} (use act_batch)")
        return self.act_batch_values(np.asarray(obs)[None], None, explore)[0][0]

    @torch.inference_mode()
    def initial_priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """Sequence priorities of a sequence batch with the local network as both online and target network
        (float64, ``priority_eps`` added): what an actor inserts its sequences with."""
        b, _ = check_sequences(batch, self.config, self.env_spec.obs_shape)
        tensors = sequences_to_tensors(batch, self.device)
        out = sequence_loss(self.q_net, self.q_net, tensors, torch.ones(b, device=self.device), self.config)
        return finite_priorities(out.priorities, self.config.priority_eps)

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        return module_tensors("q_net", self.q_net)

    def load_policy_state_dict(self, d: Mapping[str, torch.Tensor]) -> None:
        """Load the learner's ``policy_state_dict``; ValueError naming wrong names/shapes changes nothing. The
        environments' states carry on across a weight update."""
        check_tensors(module_layout("q_net", self.q_net), d, "R2D2 policy weights")
        load_module_tensors("q_net", self.q_net, d)


def recurrent_batch_policy(
    env_spec: EnvSpec, config: R2D2Config, slots: Sequence[int], num_slots: int, seed: int
) -> RecurrentPolicy:
    """A vectorised actor's policy: its environments take the Ape-X epsilon ladder's rungs ``slots`` of
    ``num_slots`` (the ``AgentDef.make_batch_policy`` signature)."""
    eps = [epsilon_ladder(s, num_slots, config.epsilon_base, config.epsilon_alpha) for s in slots]
    return RecurrentPolicy(env_spec, config, epsilons=eps, seed=seed)
