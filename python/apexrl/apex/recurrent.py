"""The sequence path: the actor and the learner's sampler of an agent whose replay path writes sequences
(``ReplayPath.reader`` ``"sequences"`` or ``"queue"``; R2D2).

Actor (:class:`RecurrentActor`), K environments in lockstep (``envs_per_actor``, K = 1 included)::

    s = envs.reset(); first = [True] * K
    repeat:
        a, (h, c) = policy.act_batch_state(s, first)     one batched recurrent step; (h, c)[j]: the state env j's
                                                          step started from (zeroed where first[j])
        s', r, terminated, truncated = envs.step(a)
        adder_j.add(a_j, raw r_j, s'_j, terminated_j, truncated_j, extras={state_h: h_j, state_c: c_j})
        first = which episodes ended (their adder starts the next one with add_first)

The K adders are the agent's (``ReplayPath.make_adder``, e.g. :mod:`apexrl.agents.r2d2.replay`), one per
environment, each with its own trajectory writer on the path's table; they report ``counters()`` (items stored,
pending, skipped) and can ``discard()`` what their writer holds. An item's extras are those of its first step:
the recurrent state the policy held when it acted on that step's observation, so the learner unrolls from
exactly that state (tests/apex/test_recurrent.py holds it bit for bit through a real server). Rewards are stored
unclipped (``raw_reward``: value rescaling instead).

Failures: a writer error (the replay server gone longer than the writer's own retries) drops that environment's
open episode (``adder.reset()``; the items already made stay) and the environment records again from its next
episode; it is counted in ``insert_retries`` and logged. Stopping: the actor stops stepping, flushes what the
writers hold within the stop's grace period and drops the open episodes (an item is only made of whole
sequences: there is no truncation step to add without stepping the environment).

Learner: :class:`SequenceSampler` samples the table and hands the learner's loop the agent's batch
(``ReplayPath.make_batch``) with the same ``decoded`` tuple the transition decoders give (the good items' fields,
which items did not decode, which decoded ones the agent refuses), so the loop, its erasures and its counters
are the transition path's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from apexrl.agents import get_agent
from apexrl.agents.base import batch_policy
from apexrl.apex.actor import Actor
from apexrl.apex.config import ActorConfig
from apexrl.apex.stopping import STOP_GRACE_S
from apexrl.errors import ApexRLError, Interrupted, ReplayTimeout
from apexrl.replay.client.sharded import ShardedReplayClient
from apexrl.replay.client.sharded import connect as connect_replay

log = logging.getLogger("apexrl.apex.actor")

__all__ = ["RecurrentActor", "SequenceSampler"]


def _single_client(endpoints: str, timeout: float, curve: Any) -> Any:
    client = connect_replay(endpoints, timeout=timeout, curve=curve)
    # A ShardedReplayClient has writers too (one server each), but sampling sequences from several servers is not
    # tested end to end yet: `apexrl run` refuses --replay-servers > 1 for such an agent, and so does this.
    if isinstance(client, ShardedReplayClient):
        client.close()
        raise ValueError(
            f"a recurrent agent writes sequences through one replay server; got several ({endpoints}): "
            "run it with --replay-servers 1"
        )
    return client


class RecurrentActor(Actor):
    """The actor of a recurrent agent (module docstring); :meth:`run`, :meth:`stop` and :meth:`close` as
    :class:`~apexrl.apex.actor.Actor`'s."""

    def __init__(self, config: ActorConfig):  # not Actor.__init__: no n-step path, no TransitionSpec
        k = self._start_envs(config)
        agent = get_agent(config.agent)
        # One recurrent policy for the K environments (K = 1 too): environment j explores as slot index*K + j.
        self.policy: Any = batch_policy(
            agent, self.spec, config.agent_config, config.index, config.num_actors, k, self.seed
        )
        explorations = list(self.policy.explorations)
        path = agent.replay
        if path.make_adder is None:
            raise ValueError(f"agent {agent.name}: its replay path ({path.reader}) writes no sequences")
        self.replay = _single_client(config.replay, config.replay_timeout, config.curve_dir)
        self.adders: list[Any] = []
        try:
            self.adders = list(path.make_adder(self.replay, path.table, self.spec, config.agent_config, k))
            if len(self.adders) != k:
                raise ValueError(f"agent {agent.name}: make_adder made {len(self.adders)} adders for {k} environments")
        except BaseException:
            self._close_adders()
            self.replay.close()
            raise
        self._connect_params()
        self.counters = {
            "steps": 0,
            "frames": 0,
            "episodes": 0,
            "inserted": 0,
            "untrainable": 0,
            "insert_retries": 0,
            "rate_limited": 0,
            "not_inserted": 0,
        }
        self._open_episode_outputs(k, explorations)

    def _close_adders(self) -> None:
        for adder in self.adders:
            try:
                adder.close()
            except (ApexRLError, RuntimeError) as e:  # what it still held is counted by _finish
                log.warning("actor %d: closing a sequence writer: %s", self.config.index, e)

    def close(self) -> None:
        self._close_adders()
        super().close()

    def _count(self, name: str) -> int:
        """The adders' counter ``name`` summed: ``stored`` (on the server), ``pending`` or ``skipped``."""
        return sum(int(a.counters()[name]) for a in self.adders)

    def run(self) -> dict[str, int]:
        self._wait_first_params()
        self._start = self._last_log = time.monotonic()
        self._run_sequences()
        self._log_progress(time.monotonic() - self._start)
        return {**self.counters, "params_version": self.poller.version}

    def _run_sequences(self) -> None:
        k = self.envs.num_envs
        obs = self.envs.reset()
        recording = np.ones(k, bool)  # False: the environment's episode was dropped after a writer error
        for j in range(k):
            self.adders[j].add_first(obs[j])
        rec = self.recorder
        if rec is not None:
            for j in range(k):
                rec.start(j, obs[j])
        first = np.ones(k, bool)
        ep_return, ep_len = np.zeros(k), np.zeros(k, np.int64)
        while not self._stop.is_set():
            actions, (h, c) = self.policy.act_batch_state(obs, first)
            step = self.envs.step(actions)
            first = np.zeros(k, bool)
            for j in range(k):
                ended = j in step.final_obs
                nxt = step.final_obs[j] if ended else step.obs[j]
                if recording[j]:
                    try:
                        self.adders[j].add(
                            actions[j],
                            float(step.raw_reward[j]),
                            nxt,
                            bool(step.terminated[j]),
                            bool(step.truncated[j]),
                            extras={"state_h": h[j], "state_c": c[j]},
                        )
                    except (ReplayTimeout, ApexRLError) as e:
                        recording[j] = False
                        self._writer_failed(j, e)
                if ended:
                    first[j] = True
                    if not recording[j]:
                        self.adders[j].reset()
                        recording[j] = True
                    self.adders[j].add_first(step.obs[j])
            if rec is not None:
                self._record_step(rec, actions, step, sorted(step.final_obs))
            self.counters["steps"] += k
            self.counters["frames"] += k * self.spec.frames_per_step
            ep_return += step.raw_reward
            ep_len += 1
            for j in sorted(step.final_obs):
                self._end_episode(j, float(ep_return[j]), int(ep_len[j]), time.monotonic() - self._start)
                ep_return[j], ep_len[j] = 0.0, 0
            obs = step.obs
            self.counters["inserted"] = self._count("stored")
            self.counters["untrainable"] = self._count("skipped")
            if self._poll_and_log():  # the writers send as items fill up: no local batch to flush
                break
        self._finish()

    def _writer_failed(self, j: int, e: Exception) -> None:
        self.counters["insert_retries"] += 1
        self.adders[j].reset()
        log.warning(
            "actor %d: environment %d's sequence writer failed (%s); its episode is dropped, the next one is recorded",
            self.config.index,
            j,
            e,
        )

    def _finish(self) -> None:
        """Stopping: send what the writers hold within the grace period; count what they could not."""
        deadline = time.monotonic() + STOP_GRACE_S
        for adder in self.adders:
            adder.reset()  # the open episode: no whole item can be made of it without stepping
            try:
                adder.flush(timeout=max(0.1, deadline - time.monotonic()))
            except (ApexRLError, Interrupted, TimeoutError) as e:
                log.warning("actor %d: stopping with sequences not inserted (%s)", self.config.index, e)
        self.counters["inserted"] = self._count("stored")
        self.counters["not_inserted"] = self._count("pending")
        for adder in self.adders:
            # Given up: the writer's close() must not try them again without a deadline (a server that is gone
            # would hold the stop for its retries).
            adder.discard()


class _Sampled:
    """What the learner's loop reads of a sampled batch: keys, IS weights and ``decoded``."""

    def __init__(self, keys: np.ndarray, weights: np.ndarray, decoded: tuple):
        self.keys, self.weights, self.decoded = keys, weights, decoded


class SequenceSampler:
    """``next(timeout)`` samples ``batch_size`` sequences of ``table`` and returns them as the learner's loop
    takes a prefetched batch, ``to_batch(fields, mask, extras)`` making the agent's batch of them (module
    docstring); TimeoutError when none came in time. One request at a time, in the learner's thread (no
    prefetching yet)."""

    def __init__(
        self,
        replay: Any,
        batch_size: int,
        beta: float,
        to_batch: Callable[[Any, np.ndarray, Any], dict[str, np.ndarray]],
        invalid: Any,
        table: str | None = None,
    ):
        self.replay, self.batch_size, self.beta, self.table = replay, batch_size, beta, table
        self._to_batch, self._invalid = to_batch, invalid

    def next(self, timeout: float | None = None) -> _Sampled:
        try:
            batch = self.replay.sample(self.batch_size, beta=self.beta, timeout=timeout, table=self.table)
        except ReplayTimeout as e:
            raise TimeoutError(str(e)) from None
        keys = np.ascontiguousarray(batch.keys)
        weights = np.asarray(batch.weights, np.float32)
        seq = batch.sequences
        every = np.ones(len(keys), bool)
        if seq is None:  # items that are not a writer's sequences: none of them can be trained on
            return _Sampled(keys, weights, ({}, every, "not a sequence item (inserted without a writer)", None, None))
        valid = np.asarray(seq.valid, bool)
        try:
            fields = self._to_batch(seq.fields, np.asarray(seq.mask, bool), seq.extras)
        except (KeyError, TypeError, ValueError) as e:
            return _Sampled(keys, weights, ({}, every, f"sequence items of another structure: {e}", None, None))
        bad = None if valid.all() else ~valid
        if bad is not None:
            fields = {name: v[valid] for name, v in fields.items()}
        message = None if bad is None else "a sequence item that could not be decoded"
        invalid, why = self._invalid(fields) if valid.any() else (None, None)
        return _Sampled(keys, weights, (fields, bad, message, invalid, why))

    def close(self) -> None:
        pass
