"""The sequence path of a recurrent agent (``AgentDef.recurrent``: R2D2): its actor and its learner's batches.

Actor (:class:`RecurrentActor`), K environments in lockstep (``envs_per_actor``, K = 1 included)::

    s = envs.reset(); first = [True] * K
    repeat:
        a, (h, c) = policy.act_batch_state(s, first)     one batched recurrent step; (h, c)[j]: the state env j's
                                                          step started from (zeroed where first[j])
        s', r, terminated, truncated = envs.step(a)
        adder_j.add(a_j, raw r_j, s'_j, terminated_j, truncated_j, extras={state_h: h_j, state_c: c_j})
        first = which episodes ended (their adder starts the next one with add_first)

Each environment has its own :class:`~apexrl.replay.adders.SequenceAdder` (its own trajectory writer) on the
table ``default``: items of ``R2D2Config.min_sequence_length`` steps (burn-in + trace + 1), a new one every
``sequence_period`` steps, ``pad_end_of_episode=False`` (the sampler's ``.mask`` pads an item cut by the
episode's end; R2D2's learner trains on no step where it is False). An item's extras are those of its first step:
the recurrent state the policy held when it acted on that step's observation, so the learner unrolls from
exactly that state (tests/apex/test_recurrent.py holds it bit for bit through a real server). Items go in at
priority None: the table's largest priority so far (the usual default for new experience, and what Acme's R2D2
does), not an actor-computed one -- the adder makes an item only once its steps are appended, without handing
the sequence back. Rewards are stored unclipped (``raw_reward``: value rescaling instead). An item of fewer than
``burn_in + 2`` steps (an episode's end cuts it short) holds no trained step: it is not made (``untrainable`` in
the actor's counters), where the learner would only erase it.

Failures: a writer error (the replay server gone longer than the writer's own retries) drops that environment's
open episode (``adder.reset()``; the items already made stay) and the environment records again from its next
episode; it is counted in ``insert_retries`` and logged. Stopping: the actor stops stepping, flushes what the
writers hold within the stop's grace period and drops the open episodes (an item is only made of whole
sequences: there is no truncation step to add without stepping the environment).

Learner: :class:`SequenceSampler` samples the table and hands the learner's loop the batch format of
:mod:`apexrl.agents.r2d2.sequences` with the same ``decoded`` tuple the transition decoders give (the good
items' fields, which items did not decode, which decoded ones the agent refuses), so the loop, its erasures
and its counters are the transition path's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from apexrl.agents import get_agent
from apexrl.agents.base import batch_policy
from apexrl.apex.actor import Actor
from apexrl.apex.config import ActorConfig
from apexrl.apex.stopping import STOP_GRACE_S
from apexrl.errors import ApexRLError, Interrupted, ReplayTimeout
from apexrl.replay.adders import SequenceAdder
from apexrl.replay.client.sharded import ShardedReplayClient
from apexrl.replay.client.sharded import connect as connect_replay
from apexrl.replay.tables import DEFAULT_TABLE

log = logging.getLogger("apexrl.apex.actor")

__all__ = ["RecurrentActor", "SequenceSampler", "sequence_batch"]


def _single_client(endpoints: str, timeout: float, curve: Any) -> Any:
    client = connect_replay(endpoints, timeout=timeout, curve=curve)
    # A ShardedReplayClient has writers too (one server each), but the recurrent learner's sampling of several
    # servers is not tested end to end yet: `apexrl run` refuses --replay-servers > 1 for it, and so does this.
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
        cfg = config.agent_config
        self.replay = _single_client(config.replay, config.replay_timeout, config.curve_dir)
        self.adders: list[SequenceAdder] = []
        self._writers: list[_TrainableItems] = []
        try:
            for _ in range(k):
                source = _TrainableItemsClient(self.replay, cfg.burn_in + 2)
                self.adders.append(
                    SequenceAdder(
                        source, DEFAULT_TABLE, cfg.min_sequence_length, cfg.sequence_period, pad_end_of_episode=False
                    )
                )
                assert source.made is not None
                self._writers.append(source.made)
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

    def _items_stored(self) -> int:
        """Items the writers have stored on the server (made minus still pending)."""
        return sum(w.writer.items_created - w.writer.pending_items for w in self._writers)

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
            self.counters["inserted"] = self._items_stored()
            self.counters["untrainable"] = sum(w.skipped for w in self._writers)
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
        self.counters["inserted"] = self._items_stored()
        self.counters["not_inserted"] = sum(w.writer.pending_items for w in self._writers)
        for w in self._writers:
            # Given up: the writer's close() must not try them again without a deadline (a server that is gone
            # would hold the stop for its retries).
            w.writer.discard()


class _TrainableItems:
    """A trajectory writer that makes only items with a trained step: an item of fewer than burn_in + 2 steps
    (an episode's last item cut short by its end, or an episode shorter than that) holds none -- the learner would
    erase it as invalid (``R2D2Learner.invalid_items``) -- so it is not sent (counted in ``skipped``)."""

    def __init__(self, writer: Any, min_steps: int):
        self.writer, self.min_steps, self.skipped = writer, min_steps, 0

    def append(self, step: Any) -> None:
        self.writer.append(step)

    def create_item(self, table: str, num_timesteps: int, priority: float | None, extras: Any = None) -> None:
        if num_timesteps < self.min_steps:
            self.skipped += 1
            return
        self.writer.create_item(table, num_timesteps, priority, extras=extras)

    def end_episode(self) -> None:
        self.writer.end_episode()

    def flush(self, timeout: float | None = None) -> None:
        self.writer.flush(timeout=timeout)

    def close(self) -> None:
        self.writer.close()


class _TrainableItemsClient:
    """What a SequenceAdder takes as its client: ``writer(...)`` makes the replay client's writer, wrapped."""

    def __init__(self, client: Any, min_steps: int):
        self.client, self.min_steps = client, min_steps
        self.made: _TrainableItems | None = None

    def writer(self, max_sequence_length: int) -> _TrainableItems:
        self.made = _TrainableItems(self.client.writer(max_sequence_length=max_sequence_length), self.min_steps)
        return self.made


def sequence_batch(
    fields: Mapping[str, Any], mask: np.ndarray, extras: Mapping[str, Any], length: int
) -> dict[str, np.ndarray]:
    """The R2D2 batch (:mod:`apexrl.agents.r2d2.sequences`) of sampled sequence items: the writer's steps
    ``{obs, action, reward, discount}`` (n, T, ...), ``mask`` (n, T) and extras ``{state_h, state_c}``; T is
    padded (mask False, discount 1) or cut to ``length``."""
    n, t = mask.shape
    obs = np.asarray(fields["obs"])
    out = {
        "obs": np.zeros((n, length, *obs.shape[2:]), obs.dtype),
        "action": np.zeros((n, length), np.int32),
        "reward": np.zeros((n, length), np.float32),
        "discount": np.ones((n, length), np.float32),
        "mask": np.zeros((n, length), bool),
    }
    m = min(t, length)
    out["obs"][:, :m] = obs[:, :m]
    out["action"][:, :m] = np.asarray(fields["action"])[:, :m]
    out["reward"][:, :m] = np.asarray(fields["reward"])[:, :m]
    out["discount"][:, :m] = np.where(mask[:, :m], np.asarray(fields["discount"])[:, :m], 1.0)
    out["mask"][:, :m] = mask[:, :m]
    out["state_h"] = np.ascontiguousarray(extras["state_h"], np.float32)
    out["state_c"] = np.ascontiguousarray(extras["state_c"], np.float32)
    return out


class _Sampled:
    """What the learner's loop reads of a sampled batch: keys, IS weights and ``decoded``."""

    def __init__(self, keys: np.ndarray, weights: np.ndarray, decoded: tuple):
        self.keys, self.weights, self.decoded = keys, weights, decoded


class SequenceSampler:
    """``next(timeout)`` samples ``batch_size`` sequences of the table ``default`` and returns them as the
    learner's loop takes a prefetched batch (module docstring); TimeoutError when none came in time. One
    request at a time, in the learner's thread (no prefetching yet)."""

    def __init__(self, replay: Any, batch_size: int, beta: float, length: int, invalid: Any):
        self.replay, self.batch_size, self.beta, self.length = replay, batch_size, beta, length
        self._invalid = invalid

    def next(self, timeout: float | None = None) -> _Sampled:
        try:
            batch = self.replay.sample(self.batch_size, beta=self.beta, timeout=timeout)
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
            fields = sequence_batch(seq.fields, np.asarray(seq.mask, bool), seq.extras, self.length)
        except (KeyError, TypeError, ValueError) as e:
            return _Sampled(keys, weights, ({}, every, f"sequence items of another structure: {e}", None, None))
        bad = None if valid.all() else ~valid
        if bad is not None:
            fields = {name: v[valid] for name, v in fields.items()}
        message = None if bad is None else "a sequence item that could not be decoded"
        invalid, why = self._invalid(fields) if len(fields["obs"]) else (None, None)
        return _Sampled(keys, weights, (fields, bad, message, invalid, why))

    def close(self) -> None:
        pass
