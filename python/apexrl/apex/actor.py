"""The actor of every agent: K environments (``envs_per_actor``, usually 1), a local copy of the policy, and what
the agent's replay path (``AgentDef.replay``) writes: Ape-X's n-step transitions (the default, below), or the
agent's own adders (the sequence path, further below).

Loop (Horgan et al. 2018, Algorithm 1, over K environments in lockstep)::

    s = envs.reset()                                      K environments (apexrl.envs.make_vec_env)
    repeat:
        a_j = π(s_j) with env j's exploration             one batched forward pass for all K (K = 1: ``act``)
        s', r, terminated, truncated = envs.step(a)       an environment whose episode ended resets itself
        n-step buffer j ← (a_j, r_j, s'_j)  → completed n-step transitions go to the local batch (s'_j: the
                                              episode's last observation where it ended; episodes.csv: ``env``)
        every B steps (B·K transitions): priorities = |δ| from the actor's own networks; INSERT(batch, priorities)
        every `params_every_frames` frames: ask the learner for newer weights (non-blocking beyond a timeout)

The n-step path is the package's adder: :class:`~apexrl.replay.adders.NStepTransitionAdder` for K = 1, its
vectorised form :class:`~apexrl.replay.adders.VecNStepTransitionAdder` for K > 1, each with ``insert_batch`` B·K
and the actor's own priority function; the "client" it inserts through is the actor's pipelined, TransitionSpec-
encoded insert (the structured insert's fast case, :meth:`Actor._send`). The vectorised adder holds handles into
one ring of observations, so a batch gathers its obs and next_obs in one indexing each. A batched policy that hands
out the values of its acting pass (``act_batch_values``; Ape-X DQN) scores the batch from them
(``priorities_from_values``) instead of two more forward passes over it.

Inserts: with ``inserts_in_flight`` 1 each insert waits for its reply before the actor steps on. With N > 1 the
actor steps on while up to N inserts are unanswered (a :class:`~apexrl.replay.client.inserter.PipelinedInserter`
with ``resend``): it holds each sent batch, encoded, with its insert id until the server stored it, and pauses
stepping only while N are held. The actor needs nothing from an acknowledgement but its count (``inserted``), so
replies may come in any order.

Failures: when the replay server does not answer, the actor keeps the batch and retries with back-off
(stepping pauses meanwhile, so nothing is dropped and memory stays bounded); every attempt of one batch
carries the same insert id, so a timed-out insert that was applied is not stored again (exactly-once). With N
in flight the same holds for each held batch: after a reconnect (server restarted, no reply in time) or a
rate-limiter refusal each is resent with its own insert id. When the parameter service does not
answer, the actor keeps acting with the weights it has.

Stopping (SIGTERM/SIGINT, see :mod:`apexrl.apex.stopping`): the actor stops stepping, ends the open episode
as a truncation and tries once more to insert what it holds; a server that is stopping too refuses at once
or is given up after the grace period, and the actor says how many transitions it could not hand over.

The sequence path (``ReplayPath.reader`` ``"sequences"`` or ``"queue"``; R2D2), K environments in lockstep
(K = 1 included), one policy for all K::

    s = envs.reset(); first = [True] * K
    repeat:
        a, extras = policy.act_batch_extras(s, first)     one batched step; extras[j]: what env j's step stores
                                                           beside it (R2D2: the recurrent state it started from,
                                                           zeroed where first[j]); a policy without the method:
                                                           act_batch(s), no extras
        s', r, terminated, truncated = envs.step(a)
        adder_j.add(a_j, raw r_j, s'_j, terminated_j, truncated_j, extras=extras[j])
        first = which episodes ended (their adder starts the next one with add_first)

The K adders are the agent's (``ReplayPath.make_adder``), one per environment, each with its own trajectory
writer on the path's table; they report ``counters()`` (items ``stored`` on the server, ``pending`` in the
writer, ``skipped``: not made, the actor's ``untrainable``) and ``discard()`` what their writer still holds. The
state is the policy's business: an item's extras are whatever the adder keeps of its steps' extras (R2D2's
``SequenceAdder`` keeps the first step's, so the learner unrolls from exactly the state the actor acted from;
tests/apex/test_recurrent.py holds it bit for bit through a real server). Rewards are stored unclipped
(``raw_reward``). A writer error (the replay server gone longer than the writer's own retries) drops that
environment's open episode (``adder.reset()``; the items already made stay), counted in ``insert_retries``; the
environment records again from its next episode. Stopping: the actor stops stepping, flushes what the writers
hold within the stop's grace period and drops the open episodes (an item is only made of whole sequences).

A synchronous path (``ReplayPath.wait_for_weights``; the on-policy agents by default, as Tonic acts and learns in
turn): once each of the K environments has made an item since the last wait, the actor sends what its writers
hold and polls the parameter service until weights newer than those it acted with arrive -- the learner's update
on those items -- counted in ``weight_waits``. A learner that publishes nothing within ``_SYNC_WAIT`` seconds
does not hold the actor: it acts on (``weight_wait_timeouts``, warned once).
"""

from __future__ import annotations

import csv
import fcntl
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from apexrl.agents import get_agent
from apexrl.agents.base import AgentDef, batch_policy
from apexrl.apex.config import EPISODE_COLUMNS, ActorConfig
from apexrl.apex.report import ProgressReporter
from apexrl.apex.stopping import STOP_GRACE_S
from apexrl.durable import append_private, make_private_dirs
from apexrl.envs.base import SerialVecEnv
from apexrl.errors import ApexRLError, Interrupted, ReplayTimeout, ServerClosedError
from apexrl.replay.adders.transition import NStepTransitionAdder, Transition, VecNStepTransitionAdder
from apexrl.replay.client.inserter import PipelinedInserter
from apexrl.replay.client.replay_client import ServerTimeoutError
from apexrl.replay.client.sharded import ShardedReplayClient
from apexrl.replay.client.sharded import connect as connect_replay
from apexrl.replay.wire.frames import frame_codec, wire_spec
from apexrl.replay.wire.schema import MAX_BATCH

log = logging.getLogger("apexrl.apex.actor")

_RETRY_MIN, _RETRY_MAX = 0.05, 2.0
_SYNC_WAIT = 5.0  # seconds a synchronous actor waits for new weights before acting on
_SYNC_POLL = 0.002  # seconds between its polls of the parameter service meanwhile
_RATE_LIMIT_WAIT = 5.0  # seconds the server may hold an insert for its rate limiter before answering TIMEOUT
_STOPPED = "the replay server did not take them before the stop"


class _Stopping(Exception):
    """Raised from the inserter's retry hook when the actor is stopping: give up what is held."""


class _Unsent(Exception):
    """Stopping, and the replay server did not take a batch the adder handed over: ``taken`` of its rows left the
    adder's count (stored, or among the inserter's ``lost``), ``lost`` batches the inserter held are dropped."""

    def __init__(self, why: str, taken: int = 0, lost: int = 0):
        super().__init__(why)
        self.why, self.taken, self.lost = why, taken, lost


class _Sink:
    """The n-step adder's client: its inserts go to :meth:`Actor._send`."""

    def __init__(self, actor: Actor):
        self._actor = actor

    def insert(self, priorities: Any, batch: dict[str, np.ndarray], *, table: str) -> None:
        self._actor._send(batch, priorities)


class Actor:
    """Runs :meth:`run` until :meth:`stop` (or SIGTERM/SIGINT via :func:`apexrl.cli.actor.run_actor`) or ``max_steps``."""

    def __init__(self, config: ActorConfig):
        k = self._start_envs(config)
        agent = get_agent(config.agent)
        self.path = agent.replay
        self.adders: list[Any] | None = None  # the sequence path's adders, one per environment; None: n-step
        # Synchronous actors (ReplayPath.wait_for_weights) wait for new weights after each round of items.
        self._synchronous = self.path.synchronous(config.agent_config)
        if self.path.transitions:
            explorations = self._init_transitions(agent, config, k)
        else:
            explorations = self._init_sequences(agent, config, k)
        self._open_episode_outputs(k, explorations)

    def _init_transitions(self, agent: AgentDef, config: ActorConfig, k: int) -> list[float | None]:
        """The n-step transition path (module docstring): policy, TransitionSpec codec, observation ring, replay
        client and inserter, parameter client, n-step adder, counters; returns the explorations."""
        # K = 1 acts exactly as before batching existed (``act``); K > 1 through one batched policy whose
        # environment j explores as slot index*K + j of num_actors*K.
        # A Policy for K = 1; for K > 1 a batch policy, which also has act_batch, explorations and maybe the
        # value-scoring methods (duck-typed: see the comment in apexrl.agents.base.Policy).
        self.policy: Any
        if k == 1:
            self.policy = agent.make_policy(self.spec, config.agent_config, config.index, config.num_actors, self.seed)
            explorations = [getattr(self.policy, "exploration", None)]
        else:
            self.policy = batch_policy(
                agent, self.spec, config.agent_config, config.index, config.num_actors, k, self.seed
            )
            explorations = list(self.policy.explorations)
        self.transition_spec = self.policy.transition_spec
        # Frame stacks (Atari) go to the replay as items referencing each batch's distinct frames, stored once.
        self.codec = frame_codec(self.transition_spec)
        unknown = [name for name in self.transition_spec.names if name not in Transition._fields]
        if unknown:
            raise ValueError(f"spec fields {unknown} are not n-step transition fields {list(Transition._fields)}")
        n, gamma = config.agent_config.n_step, config.agent_config.gamma
        # B per environment: K environments are K of the paper's actors, each with its local buffer of B, so one
        # request carries B·K transitions and each waits at most B of its environment's steps (as with K = 1).
        self.flush_size = config.flush_every * k
        if self.flush_size > MAX_BATCH:
            raise ValueError(
                f"flush_every {config.flush_every} x envs_per_actor {k} = {self.flush_size} transitions "
                f"per insert, more than the protocol's {MAX_BATCH}: lower one of them"
            )
        # K > 1: the n-step adder holds handles into one ring of observations (and of the Q-values the acting
        # forward pass computed, where the policy hands them out): each batch gathers its observations in one
        # indexing and is scored without another forward pass. In S steps each environment completes at least
        # S - (n - 1) transitions (an n-step buffer holds at most n - 1 pending), so a batch of B·K is inserted at
        # most B + n - 1 steps after the previous one, and no handle it or a buffer holds is older than that plus
        # n steps; each step stores K observations and up to K last ones.
        scores = k > 1 and all(
            hasattr(self.policy, a) for a in ("act_batch_values", "values", "priorities_from_values")
        )
        steps = config.flush_every + 2 * n + 8
        self.frames = _ObsRing(2 * k * steps if k > 1 else 0, self.spec, scores)
        # The client's table is the path's: its inserts and its spec's declaration go there.
        self.replay = connect_replay(
            config.replay,
            timeout=config.replay_timeout,
            spec=wire_spec(self.transition_spec),
            curve=config.curve_dir,
            table=self.path.table,
        )
        # N > 1 inserts in flight: the inserter sends through the actor's own client (the actor makes no other
        # request on it), so stopping interrupts both, and holds at most N batches until they are stored.
        self._inserter: PipelinedInserter | None = None
        self._delay, self._warned_at = _RETRY_MIN, 0.0  # back-off of the inserter's retries; reset by a reply
        if config.inserts_in_flight > 1:
            self._inserter = PipelinedInserter(
                lambda: self.replay,
                config.inserts_in_flight,
                timeout=_RATE_LIMIT_WAIT,
                on_ack=self._acked,
                client_timeout=config.replay_timeout,
                resend=True,
                on_retry=self._retry,
            )
        self._connect_params()
        # The n-step adder (module docstring): it inserts B·K transitions at a time through _send, scored by _score.
        self.adder: NStepTransitionAdder | VecNStepTransitionAdder
        if k == 1:
            self.adder = NStepTransitionAdder(
                _Sink(self), self.path.table, n, gamma, self._score, insert_batch=self.flush_size
            )
        else:
            self.adder = VecNStepTransitionAdder(
                _Sink(self), self.path.table, n, gamma, k, self._score, insert_batch=self.flush_size
            )
        self._staged: tuple[dict, dict[str, np.ndarray]] | None = None  # _score's batch and its TransitionSpec arrays
        self.counters = {
            "steps": 0,
            "frames": 0,
            "episodes": 0,
            "inserted": 0,
            "insert_retries": 0,
            "rate_limited": 0,
            "not_inserted": 0,
        }
        return explorations

    def _init_sequences(self, agent: AgentDef, config: ActorConfig, k: int) -> list[float | None]:
        """The sequence path (module docstring): one policy for the K environments (K = 1 too; environment j
        explores as slot index*K + j), the agent's adders on one replay client, the parameter client, counters;
        returns the explorations."""
        self.policy = batch_policy(agent, self.spec, config.agent_config, config.index, config.num_actors, k, self.seed)
        explorations = list(self.policy.explorations)
        self.replay = _sequence_client(
            config.replay, config.replay_timeout, config.curve_dir, self.path.one_server, self.path.table
        )
        self.adders = []
        try:
            assert self.path.make_adder is not None  # ReplayPath requires it beside a sequence reader
            self.adders = list(self.path.make_adder(self.replay, self.path.table, self.spec, config.agent_config, k))
            if len(self.adders) != k:
                raise ValueError(f"agent {agent.name}: make_adder made {len(self.adders)} adders for {k} environments")
        except BaseException:
            self._close_adders()
            self.replay.close()
            raise
        self._connect_params()
        # A synchronous actor's items per environment at its last wait for weights.
        self._made_at_wait = [0] * k
        self.counters = {
            "steps": 0,
            "frames": 0,
            "episodes": 0,
            "inserted": 0,
            "untrainable": 0,
            "weight_waits": 0,
            "weight_wait_timeouts": 0,
            "insert_retries": 0,
            "rate_limited": 0,
            "not_inserted": 0,
        }
        return explorations

    def _start_envs(self, config: ActorConfig) -> int:
        """What every actor starts with (either path): its config, seed, torch threads and its K
        environments; returns K."""
        from apexrl.envs import make_vec_env

        if not 0 <= config.index < config.num_actors:
            raise ValueError(f"index must be in [0, num_actors={config.num_actors}), got {config.index}")
        self.config = config
        self.seed = config.seed * 10007 + config.index
        torch.set_num_threads(config.torch_threads)
        k = config.envs_per_actor
        # K environments stepped together: the family's batched backend where it has one (Atari: ale-py's vector
        # environment and its threads), else one after the other in this thread; environment j as make_env with
        # env_seed(seed, j).
        self.envs = make_vec_env(config.env, [env_seed(self.seed, j) for j in range(k)])
        self.spec = self.envs.spec
        return k

    def _connect_params(self) -> None:
        """The parameter client and its poller, and the stop event (every actor's)."""
        from apexrl.params.service import ParamClient, ParamPoller

        config = self.config
        self.params = ParamClient(config.params, timeout=config.params_timeout, curve=config.curve_dir)
        # Never stalls on a slow or absent learner; refused weights are counted and logged once.
        self.poller = ParamPoller(
            self.params, self.policy.load_policy_state_dict, every_frames=config.params_every_frames
        )
        self._stop = threading.Event()

    def _open_episode_outputs(self, k: int, explorations: Sequence[float | None]) -> None:
        """The progress report, the --record-dataset recorder and the --episodes-csv file (every actor's)."""
        config = self.config
        self._returns: list[float] = []
        self.report = ProgressReporter("actor", config.progress_path, prefix=False)
        self._episodes_file = None
        self._episodes_csv = None
        self.recorder = None  # --record-dataset: the episodes played, as a Minari dataset (apexrl.offline.record)
        if config.record_dataset:
            from apexrl.offline.record import EpisodeRecorder

            self.recorder = EpisodeRecorder(config.record_dataset, config.index, self.spec, k)
        if config.episodes_csv:
            make_private_dirs(os.path.dirname(os.path.abspath(config.episodes_csv)))
            # A plugin agent's policy may not say how much it explores: the column stays empty then.
            self._explorations = ["" if e is None else f"{float(e):.6g}" for e in explorations]
            self._episodes_file = append_private(config.episodes_csv, newline="", encoding="utf-8")
            self._episodes_csv = csv.writer(self._episodes_file, lineterminator="\n")
            try:
                _start_episodes_file(self._episodes_file, self._episodes_csv, config.episodes_csv)
            except BaseException:
                self._episodes_file.close()
                raise

    @staticmethod
    def _record_step(rec: Any, actions: Any, step: Any, ended: Sequence[int]) -> None:
        """--record-dataset: the episode's final observation where one ended, then its new start."""
        rec.step(
            actions,
            step.reward,
            [step.final_obs.get(j, o) for j, o in enumerate(step.obs)],
            step.terminated,
            step.truncated,
        )
        for j in ended:
            rec.start(j, step.obs[j])

    # ------------------------------------------------------------------------------------------ control

    def stop(self) -> None:
        self._stop.set()

    def _close_adders(self) -> None:
        for adder in self.adders or ():
            try:
                adder.close()
            except (ApexRLError, RuntimeError) as e:  # what it still held is counted by _finish_sequences
                log.warning("actor %d: closing a sequence writer: %s", self.config.index, e)

    def close(self) -> None:
        self._close_adders()
        self.replay.close()
        self.params.close()
        self.envs.close()
        self.report.close()
        if self.recorder is not None:
            self.recorder.close()
        if self._episodes_file is not None:
            self._episodes_file.close()

    # ------------------------------------------------------------------------------------------ params

    def _wait_first_params(self) -> None:
        deadline = time.monotonic() + self.config.wait_for_params
        next_log = time.monotonic() + 10.0
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.poller.fetch_now() is not None:
                log.info(
                    "actor %d: weights version %d from %s", self.config.index, self.poller.version, self.config.params
                )
                return
            if time.monotonic() >= next_log:
                log.info("actor %d: waiting for the learner's weights at %s", self.config.index, self.config.params)
                next_log += 10.0
            self._stop.wait(0.2)
        if not self._stop.is_set():
            log.warning(
                "actor %d: no weights from %s after %.0f s; acting with its own initial weights",
                self.config.index,
                self.config.params,
                self.config.wait_for_params,
            )

    # ------------------------------------------------------------------------------------------ replay

    def _score(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """The adder's priority function: the batch as the TransitionSpec's arrays (K > 1: observations gathered
        from the ring), kept for :meth:`_send`, and its priorities from the actor's own networks."""
        if self.envs.num_envs == 1:
            spec_batch = self._spec_batch(batch, batch["obs"], batch["next_obs"])
            priorities = self.policy.initial_priorities(spec_batch)
        else:
            obs_rows, next_rows = self.frames.rows(batch["obs"]), self.frames.rows(batch["next_obs"])
            spec_batch = self._spec_batch(batch, self.frames.obs[obs_rows], self.frames.obs[next_rows])
            if self.frames.scores:
                obs_v, next_v = self.frames.values(obs_rows, next_rows, self.policy.values)
                priorities = self.policy.priorities_from_values(spec_batch, obs_v, next_v)
            else:
                priorities = self.policy.initial_priorities(spec_batch)
        self._staged = (batch, spec_batch)
        return priorities

    def _spec_batch(self, cols: dict[str, np.ndarray], obs: np.ndarray, next_obs: np.ndarray) -> dict[str, np.ndarray]:
        """The adder's stacked transitions as the batch ``TransitionSpec.encode`` takes: a field per spec field,
        exactly its (native-endian) dtype and item shape."""
        n = len(cols["reward"])
        batch: dict[str, np.ndarray] = {}
        for f in self.transition_spec.fields:
            value = obs if f.name == "obs" else next_obs if f.name == "next_obs" else cols[f.name]
            value = np.asarray(value)
            if value.shape != (n, *f.shape):
                raise ValueError(f"field {f.name!r} has shape {value.shape[1:]} per transition, expected {f.shape}")
            batch[f.name] = value.astype(f.dtype.newbyteorder("="), copy=False)
        return batch

    def _send(self, batch: dict[str, np.ndarray], priorities: Any) -> None:
        """The adder's insert: the batch :meth:`_score` prepared, with its priorities, retried until the server
        takes it (with N inserts in flight: handed to the inserter), in requests of at most ``insert_max``.

        Raises:
          _Unsent: stopping, and the server did not take all of it (the adder keeps the batch; the actor stops).
        """
        assert self._staged is not None and self._staged[0] is batch  # the adder scores each batch, then inserts it
        spec_batch, self._staged = self._staged[1], None
        priorities = np.asarray(priorities, dtype=np.float64)
        n = len(priorities)
        step = self.config.insert_max or n
        # One request, or several where the rate limiter needs smaller ones.
        parts = [
            (lo, spec_batch if step >= n else {k: v[lo : lo + step] for k, v in spec_batch.items()})
            for lo in range(0, n, step)
        ]
        inserter = self._inserter
        if inserter is None:
            for lo, part in parts:
                why = self._insert(part, priorities[lo : lo + step])
                if why is not None:  # stopping: what the earlier requests carried is stored, the rest is not
                    self.counters["inserted"] += lo
                    raise _Unsent(why, taken=lo)
            self.counters["inserted"] += n
            return
        handed = 0

        def hand_over() -> None:
            nonlocal handed
            for lo, part in parts:
                data, offsets, chunks = self._encode(part)
                inserter.insert(priorities[lo : lo + step], data=data, offsets=offsets, chunks=chunks)
                handed = min(lo + step, n)  # held by the inserter now

        self._settle(hand_over, lambda: handed)

    def _encode(self, batch: dict[str, np.ndarray]) -> tuple[Any, Any, Any]:
        if self.codec is not None:
            return self.codec.encode(batch)  # the batch's own chunks: none span two inserts
        data, offsets = self.transition_spec.encode(batch)
        return data, offsets, None

    def _settle(self, call: Any, handed: Any = lambda: 0) -> None:
        """Run an inserter call (it blocks only while N batches are held). Stopping (given up, or interrupted
        after the grace period): raise _Unsent with what the inserter held, dropped now.

        Raises:
          _Unsent: see above; ``handed()`` says how many rows of the adder's batch the inserter had taken.
        """
        inserter = self._inserter
        assert inserter is not None
        try:
            call()
            return
        except _Stopping:
            why = _STOPPED
        except Interrupted:  # stopping, and the grace period is over: the server did not take them
            why = "the replay server did not answer in time"
        finally:
            self.counters["inserted"] = inserter.counters()["acked_items"]
        raise _Unsent(why, taken=handed(), lost=inserter.discard())

    def _acked(self, _keys: Any, _seconds: float) -> None:
        self._delay, self._warned_at = _RETRY_MIN, 0.0

    def _retry(self, error: BaseException, attempts: int) -> None:
        """The inserter's retry hook: count, warn, back off as :meth:`_insert` does; raise _Stopping to give up."""
        if isinstance(error, ServerTimeoutError):
            # The server's rate limiter (--samples-per-insert) holds inserts until the learner catches up.
            self.counters["rate_limited"] += attempts
        else:
            # Server down or restarting: keep the batches, wait, go on (the client reconnects by itself).
            self.counters["insert_retries"] += attempts
            if time.monotonic() - self._warned_at >= 30.0:
                self._warned_at = time.monotonic()
                log.warning(
                    "actor %d: replay server %s unavailable (%s); retrying",
                    self.config.index,
                    self.config.replay,
                    error,
                )
            if self._stop.wait(self._delay):
                raise _Stopping
            self._delay = min(self._delay * 2, _RETRY_MAX)
        if self._stop.is_set():
            raise _Stopping

    def _insert(self, batch: dict[str, np.ndarray], priorities: np.ndarray) -> str | None:
        """One insert request, retried until the server takes it; None once taken, else (stopping) why not."""
        data, offsets, chunks = self._encode(batch)
        delay, warned_at = _RETRY_MIN, 0.0
        insert_id = self.replay.next_insert_id()  # every retry of this batch: stored once
        while True:
            try:
                self.replay.insert(
                    priorities, data=data, offsets=offsets, timeout=_RATE_LIMIT_WAIT, insert_id=insert_id, chunks=chunks
                )  # a retry carries its chunks again
                break
            except Interrupted:  # stopping, and the grace period is over: the server did not take it
                return "the replay server did not answer in time"
            except ServerTimeoutError:
                # The server's rate limiter (--samples-per-insert) holds inserts until the learner catches up.
                self.counters["rate_limited"] += 1
            except (ReplayTimeout, ServerClosedError) as e:
                # Server down or restarting: keep the batch, wait, go on (the client reconnects by itself).
                self.counters["insert_retries"] += 1
                if time.monotonic() - warned_at >= 30.0:
                    warned_at = time.monotonic()
                    log.warning(
                        "actor %d: replay server %s unavailable (%s); retrying",
                        self.config.index,
                        self.config.replay,
                        e,
                    )
                if not self._stop.wait(delay):
                    delay = min(delay * 2, _RETRY_MAX)
                    continue
            if self._stop.is_set():
                return _STOPPED
        return None

    def _give_up(self, e: _Unsent) -> None:
        """Stopping, and the server did not take everything: count and report what the actor drops."""
        lost = e.lost + self.adder.discard() - e.taken
        self.counters["not_inserted"] += lost
        log.warning("actor %d: stopping with %d transitions not inserted (%s)", self.config.index, lost, e.why)

    def _finish(self) -> None:
        """A clean stop keeps every step taken: each open episode ends here as a truncation, and what the adder
        and the inserter hold is inserted (or, past the grace period, counted as not inserted)."""
        try:
            self.adder.truncate()
            self.adder.flush()
            if self._inserter is not None:
                self._settle(self._inserter.flush)
        except _Unsent as e:
            self._give_up(e)

    # ------------------------------------------------------------------------------------------ loop

    def _act(self, obs: np.ndarray, handles: np.ndarray) -> list:
        if len(obs) == 1:
            return [self.policy.act(obs[0], explore=True)]
        if self.frames.scores:
            actions, values = self.policy.act_batch_values(obs, explore=True)
            self.frames.set_values(handles, values)
            return list(actions)
        return list(self.policy.act_batch(obs, explore=True))

    def run(self) -> dict[str, int]:
        self._wait_first_params()
        self._start = self._last_log = time.monotonic()
        if self.adders is not None:
            self._run_sequences()
            self._log_progress(time.monotonic() - self._start)
            return {**self.counters, "params_version": self.poller.version}
        try:
            (self._run_one if self.envs.num_envs == 1 else self._run_vector)()
        except _Unsent as e:  # stopping mid-insert: the server is gone or stopping too
            self._give_up(e)
        else:
            self._finish()
        self._log_progress(time.monotonic() - self._start)
        return {**self.counters, "params_version": self.poller.version}

    def _run_one(self) -> None:
        """K = 1: one Env, ``act`` per step, the NStepTransitionAdder (the array machinery of K > 1 only costs
        time here)."""
        assert isinstance(self.envs, SerialVecEnv)  # make_vec_env makes one for K = 1
        env, adder = self.envs.envs[0], self.adder
        assert isinstance(adder, NStepTransitionAdder)  # made for K = 1
        obs = env.reset()
        rec = self.recorder
        if rec is not None:
            rec.start(0, obs)
        ep_return, ep_len = 0.0, 0
        adder.add_first(obs)
        while not self._stop.is_set():
            action = self.policy.act(obs, explore=True)
            step = env.step(action)
            self.counters["steps"] += 1
            self.counters["frames"] += self.spec.frames_per_step
            adder.add(action, step.reward, step.obs, step.terminated, step.truncated)  # may insert a batch
            if rec is not None:
                rec.step([action], [step.reward], [step.obs], [step.terminated], [step.truncated])
            ep_return += step.raw_reward
            ep_len += 1
            obs = step.obs
            if step.terminated or step.truncated:
                self._end_episode(0, ep_return, ep_len, time.monotonic() - self._start)
                ep_return, ep_len = 0.0, 0
                obs = env.reset()
                adder.add_first(obs)
                if rec is not None:
                    rec.start(0, obs)
            if self._poll_and_log():
                break

    def _run_vector(self) -> None:
        """K > 1: a VecEnv, one batched act, the vectorised n-step adder over the ring's observation handles."""
        obs = self.envs.reset()
        handles = self.frames.put(obs)
        k, adder = self.envs.num_envs, self.adder
        assert isinstance(adder, VecNStepTransitionAdder)  # made for K > 1
        rec = self.recorder
        if rec is not None:
            for j in range(k):
                rec.start(j, obs[j])
        ep_return, ep_len = np.zeros(k), np.zeros(k, np.int64)
        adder.add_first(handles)
        while not self._stop.is_set():
            actions = self._act(obs, handles)
            step = self.envs.step(actions)
            handles = self.frames.put(step.obs)
            # Environments whose episode ended: their last observation is the n-step targets' (reset already).
            ended = sorted(step.final_obs)
            nexts = handles
            if ended:
                nexts = handles.copy()
                nexts[ended] = self.frames.put(np.stack([step.final_obs[j] for j in ended]))
            self.counters["steps"] += k
            self.counters["frames"] += k * self.spec.frames_per_step
            adder.add(actions, step.reward, nexts, step.terminated, step.truncated)  # may insert a batch
            if ended:
                adder.add_first(handles[ended], ended)
            if rec is not None:
                self._record_step(rec, actions, step, ended)
            ep_return += step.raw_reward
            ep_len += 1
            for j in ended:
                self._end_episode(j, float(ep_return[j]), int(ep_len[j]), time.monotonic() - self._start)
                ep_return[j], ep_len[j] = 0.0, 0
            obs = step.obs
            if self._poll_and_log():
                break

    def _run_sequences(self) -> None:
        """The sequence path (module docstring): the policy's extras go to each environment's adder."""
        adders = self.adders
        assert adders is not None  # the sequence path
        k = self.envs.num_envs
        # A policy that carries state across steps (R2D2's) acts with the environments whose episode starts and
        # hands out what each step's item keeps (its state); one without acts on the observations alone.
        act_extras = getattr(self.policy, "act_batch_extras", None)
        obs = self.envs.reset()
        recording = np.ones(k, bool)  # False: the environment's episode was dropped after a writer error
        for j in range(k):
            adders[j].add_first(obs[j])
        rec = self.recorder
        if rec is not None:
            for j in range(k):
                rec.start(j, obs[j])
        first = np.ones(k, bool)
        ep_return, ep_len = np.zeros(k), np.zeros(k, np.int64)
        while not self._stop.is_set():
            if act_extras is not None:
                actions, extras = act_extras(obs, first)
            else:
                actions, extras = self.policy.act_batch(obs, explore=True), None
            step = self.envs.step(actions)
            first = np.zeros(k, bool)
            for j in range(k):
                ended = j in step.final_obs
                nxt = step.final_obs[j] if ended else step.obs[j]
                if recording[j]:
                    try:
                        adders[j].add(
                            actions[j],
                            float(step.raw_reward[j]),
                            nxt,
                            bool(step.terminated[j]),
                            bool(step.truncated[j]),
                            extras=None if extras is None else extras[j],
                        )
                    except (ReplayTimeout, ApexRLError) as e:
                        recording[j] = False
                        self._writer_failed(j, e)
                if ended:
                    first[j] = True
                    if not recording[j]:
                        adders[j].reset()
                        recording[j] = True
                    adders[j].add_first(step.obs[j])
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
            if self._synchronous and self._wait_for_weights():
                break
            if self._poll_and_log():  # the writers send as items fill up: no local batch to flush
                break
        self._finish_sequences()

    def _wait_for_weights(self) -> bool:
        """A synchronous actor, once each environment has made an item since the last wait: send the items and
        wait for weights newer than those it acted with (the learner trains on the items, then publishes). A
        learner that publishes nothing within ``_SYNC_WAIT`` seconds (it waits for a fuller batch than the
        actors' items make) does not hold the actors: they act on, counted in ``weight_wait_timeouts``. True
        when stopping."""
        adders = self.adders or ()
        made = [int(c["stored"]) + int(c["pending"]) for c in (a.counters() for a in adders)]
        if not all(m > m0 for m, m0 in zip(made, self._made_at_wait)):
            return False
        self._made_at_wait = made
        self.counters["weight_waits"] += 1
        acted_with = self.poller.version
        deadline = time.monotonic() + _SYNC_WAIT
        try:
            for adder in adders:
                adder.flush(timeout=_SYNC_WAIT)
            while not self._stop.is_set():
                self.poller.fetch_now()
                if self.poller.version > acted_with:
                    return False
                if time.monotonic() >= deadline:
                    break
                self._stop.wait(_SYNC_POLL)
        except Interrupted:  # stopping: the learner did not answer within the grace period
            return True
        except (ApexRLError, TimeoutError) as e:
            log.warning("actor %d: sending its items before waiting for weights: %s", self.config.index, e)
        if self._stop.is_set():
            return True
        self.counters["weight_wait_timeouts"] += 1
        if self.counters["weight_wait_timeouts"] == 1:
            log.warning(
                "actor %d: no new weights %.0f s after its items went out; acting on (the learner's batch may "
                "need more items than the actors make per round)",
                self.config.index,
                _SYNC_WAIT,
            )
        return False

    def _count(self, name: str) -> int:
        """The adders' counter ``name`` summed: ``stored`` (on the server), ``pending`` or ``skipped``."""
        return sum(int(a.counters()[name]) for a in self.adders or ())

    def _writer_failed(self, j: int, e: Exception) -> None:
        assert self.adders is not None  # the sequence path
        self.counters["insert_retries"] += 1
        self.adders[j].reset()
        log.warning(
            "actor %d: environment %d's sequence writer failed (%s); its episode is dropped, the next one is recorded",
            self.config.index,
            j,
            e,
        )

    def _finish_sequences(self) -> None:
        """Stopping: send what the writers hold within the grace period; count what they could not."""
        deadline = time.monotonic() + STOP_GRACE_S
        for adder in self.adders or ():
            adder.reset()  # the open episode: no whole item can be made of it without stepping
            try:
                adder.flush(timeout=max(0.1, deadline - time.monotonic()))
            except (ApexRLError, Interrupted, TimeoutError) as e:
                log.warning("actor %d: stopping with sequences not inserted (%s)", self.config.index, e)
        self.counters["inserted"] = self._count("stored")
        self.counters["not_inserted"] = self._count("pending")
        for adder in self.adders or ():
            # Given up: the writer's close() must not try them again without a deadline (a server that is gone
            # would hold the stop for its retries).
            adder.discard()

    def _poll_and_log(self) -> bool:
        """Poll for weights and log as due; True when the loop must end."""
        cfg = self.config
        try:
            self.poller.maybe_fetch(self.counters["frames"])
        except Interrupted:  # stopping: the learner did not answer within the grace period
            return True
        now = time.monotonic()
        if now - self._last_log >= cfg.log_every:
            self._log_progress(now - self._start)
            self._last_log = now
        return bool(cfg.max_steps and self.counters["steps"] >= cfg.max_steps)

    def _end_episode(self, env: int, ret: float, length: int, elapsed: float) -> None:
        self.counters["episodes"] += 1
        self._returns.append(ret)
        if self._episodes_csv is not None:
            self._episodes_csv.writerow(
                [
                    f"{elapsed:.3f}",
                    self.config.index,
                    self.counters["frames"],
                    self.counters["episodes"],
                    f"{ret:.6g}",
                    length,
                    self._explorations[env],
                    env,
                ]
            )
            self._episodes_file.flush()  # type: ignore[union-attr]

    def _log_progress(self, elapsed: float) -> None:
        c, p = self.counters, self.poller.counters()
        recent = self._returns[-10:]
        self.report.emit(
            {
                "actor": self.config.index,
                "time_s": round(elapsed, 1),
                "steps": c["steps"],
                "frames": c["frames"],
                "episodes": c["episodes"],
                "return_mean10": float(np.mean(recent)) if recent else None,
                "inserted": c["inserted"],
                "steps_per_s": round(c["steps"] / max(elapsed, 1e-9), 1),
                "params_version": p["version"],
                "insert_retries": c["insert_retries"],
                "rate_limited": c["rate_limited"],
                "param_timeouts": p["timeouts"],
                "param_mismatches": p["mismatches"],
                # a synchronous actor's waits for new weights, and those that ran out and acted on (each lets a
                # round of items act with weights one update older: the learner's policy_lag shows it)
                **(
                    {"weight_waits": c["weight_waits"], "weight_wait_timeouts": c["weight_wait_timeouts"]}
                    if self._synchronous
                    else {}
                ),
            }
        )


class _ObsRing:
    """The last ``capacity`` observations an actor produced, by handle (a running count), and the Q-values of
    those it acted on (``scores``: the policy scores transitions from them)."""

    def __init__(self, capacity: int, spec, scores: bool):
        self.capacity = capacity
        self.obs = np.zeros((capacity, *spec.obs_shape), spec.obs_dtype)
        self.scores = scores
        self._values: np.ndarray | None = None
        self._has = np.zeros(capacity, bool)
        self._next = 0

    def put(self, obs: np.ndarray) -> np.ndarray:
        """Store a stack of observations; their handles."""
        handles = np.arange(self._next, self._next + len(obs))
        rows = handles % self.capacity
        self.obs[rows] = obs
        self._has[rows] = False
        self._next += len(obs)
        return handles

    def rows(self, handles: Sequence[int] | np.ndarray) -> np.ndarray:
        h = np.asarray(handles, np.int64)
        if h.size and h.min() < self._next - self.capacity:
            raise RuntimeError(
                f"observation {int(h.min())} was overwritten (ring of {self.capacity}, next {self._next})"
            )
        return h % self.capacity

    def set_values(self, handles: np.ndarray, values: np.ndarray) -> None:
        if self._values is None:
            self._values = np.zeros((self.capacity, *values.shape[1:]), values.dtype)
        rows = handles % self.capacity
        self._values[rows] = values
        self._has[rows] = True

    def values(self, obs_rows: np.ndarray, next_rows: np.ndarray, compute) -> tuple[np.ndarray, np.ndarray]:
        """The values of the observations at these rows; ``compute(obs)`` for those never acted on."""
        missing = np.unique(np.concatenate([obs_rows, next_rows])[~self._has[np.concatenate([obs_rows, next_rows])]])
        if missing.size:
            values = np.asarray(compute(self.obs[missing]))
            if self._values is None:
                self._values = np.zeros((self.capacity, *values.shape[1:]), values.dtype)
            self._values[missing] = values
            self._has[missing] = True
        assert self._values is not None  # allocated when the first values were computed
        return self._values[obs_rows], self._values[next_rows]


def _sequence_client(endpoints: str, timeout: float, curve: Any, one_server: str | None, table: str) -> Any:
    """The sequence path's replay client (of the path's ``table``); ValueError with the agent's reason where it
    runs on one server only and ``endpoints`` names several (as `apexrl run` refuses --replay-servers > 1 for it)."""
    client = connect_replay(endpoints, timeout=timeout, curve=curve, table=table)
    if one_server is not None and isinstance(client, ShardedReplayClient):
        client.close()
        raise ValueError(f"{one_server}; got several ({endpoints}): run it with --replay-servers 1")
    return client


def env_seed(actor_seed: int, j: int) -> int:
    """The seed of an actor's environment ``j``: the actor's own for the first (as before vectorised actors),
    then 63-bit seeds drawn from (actor seed, j), distinct from every actor's and from each other."""
    if j == 0:
        return actor_seed
    return int(np.random.SeedSequence([actor_seed, j]).generate_state(1, np.uint64)[0] >> 1)


def _start_episodes_file(file, writer, path: str) -> None:
    """Write the header to an empty episodes file, else check the one there. The actors of a run share the file
    and start together: the check and the write happen under an exclusive lock, so that only one of them can
    see the file empty and write the header."""
    fcntl.flock(file.fileno(), fcntl.LOCK_EX)
    try:
        if os.fstat(file.fileno()).st_size == 0:
            writer.writerow(EPISODE_COLUMNS)
            file.flush()
        else:
            _check_episodes_header(path)
    finally:
        fcntl.flock(file.fileno(), fcntl.LOCK_UN)


def _check_episodes_header(path: str) -> None:
    """Rows are appended in EPISODE_COLUMNS' order: refuse a file whose header says otherwise (one from an older
    version: ``apexrl run --resume`` upgrades it before starting the actors)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        header = f.readline().strip()
    if header != ",".join(EPISODE_COLUMNS):
        raise ValueError(
            f"{path} has columns {header!r}, expected {','.join(EPISODE_COLUMNS)!r}: use another "
            "--episodes-csv (apexrl run --resume upgrades an older run's file itself)"
        )
