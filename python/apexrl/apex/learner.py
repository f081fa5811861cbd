"""The Ape-X learner: prioritized batches in, gradient steps, priorities and weights out.

Loop (Horgan et al. 2018, Algorithm 2)::

    wait until the replay holds min_replay_size transitions
    for each prefetched batch (keys, IS weights, decoded transitions):
        priorities, metrics = agent.update(batch, weights)     # one step; target copies on schedule
        send (keys, priorities) without waiting for the reply
        every remove_to_fit_every steps: ask the replay to evict down to capacity
        every publish_every steps: publish the weights to the parameter service
        every checkpoint_every steps: checkpoint (also on SIGTERM/SIGINT and at the end); a checkpoint that
            cannot be written (disk full) is warned about, counted (checkpoint_failures) and retried at the
            next interval, and the previous one stays valid
    every metrics_every seconds: one row of metrics.csv; every eval_every seconds: start an evaluation; one
        that scores higher than any before replaces best_checkpoint.safetensors (:mod:`apexrl.apex.best`)

With ``eval_weights="polyak"`` each step also moves a running average of the policy's parameters, and the
evaluations, the best checkpoint and the checkpoints' ``polyak/...`` entries hold it (:mod:`apexrl.apex.polyak`);
the actors get the online weights.

Evaluation runs greedy (DQN) or noiseless (DPG) episodes on the learner's own environment copy in a
low-priority child process with a snapshot of the weights, so training does not pause for it.

An item the learner cannot decode (a foreign or corrupted one, which a replay server without a spec lets
through) does not stop it: the item is erased from the replay, counted (``undecodable_items`` in metrics.csv,
the progress file and the summary) and the step trains on the rest of the batch (or is skipped when nothing
is left). So is an item that decodes but holds values the agent cannot train on (``Agent.invalid_items``: an
action index out of range, a NaN reward, ...), counted as ``invalid_items``; the divergence check on the
update's own TD errors stays.

``env_frames`` in metrics.csv is the number of transitions the replay server has received times the
environment's frames per agent step: every agent step of every actor yields exactly one n-step transition. For an
agent whose items stand for several steps (``ReplayPath.steps_per_item``; R2D2's sequences: ``sequence_period``)
it is the items received times that (an estimate: an episode's last item stands for fewer steps).

The sampler is the one the agent's replay path names (``ReplayPath.reader``): the prefetching sampler, whose
decode threads decode TransitionSpec-encoded transitions or (``"sequences"``, :mod:`apexrl.apex.sequences`)
sequence items natively into its ring of preallocated batches, made into the agent's batch by
``ReplayPath.make_batch``; a ``"queue"`` is read one whole batch at a time, and hands each item out once: no
priorities go back. A synchronous path's learner (``ReplayPath.wait_for_weights``) that starts while its queue
already holds whole batches (a resumed run: the actors' last round before the stop was never trained on) first
publishes after its updates on them: the actors, waiting for their first weights meanwhile, then act with the
weights trained on that backlog; publishing at once would leave their every round one batch behind it, trained
one update late for the rest of the run.

Stopping (SIGTERM/SIGINT, see :mod:`apexrl.apex.stopping`): the loop ends, the last priority updates get what
is left of the grace period, and the final checkpoint is written; the learner says how many updates it could
not confirm and exits within seconds even when the replay server is gone.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from typing import Any

import numpy as np
import torch

from apexrl.agents import Agent, get_agent
from apexrl.agents.validity import all_finite
from apexrl.apex.best import BestCheckpoint
from apexrl.apex.checkpoint import load_checkpoint, save_checkpoint
from apexrl.apex.config import LearnerConfig, default_run_dir
from apexrl.apex.cpu import CPU_COLUMNS, CPUMeter
from apexrl.apex.evaluator import Evaluator
from apexrl.apex.metrics import CSVWriter, Mean
from apexrl.apex.polyak import PolyakAverage, split_average
from apexrl.apex.report import ProgressReporter
from apexrl.apex.stopping import STOP_GRACE_S, StopOnSignal
from apexrl.durable import make_private_dirs
from apexrl.errors import ApexRLError, AuthenticationError
from apexrl.replay.client.replay_client import table_stats
from apexrl.replay.client.sharded import connect as connect_replay
from apexrl.replay.wire.codec import BatchDecoder, TransitionSpec
from apexrl.replay.wire.frames import FrameBatchDecoder, frame_codec
from apexrl.security import raise_nofile_limit

log = logging.getLogger("apexrl.apex.learner")

CHECKPOINT_NAME = "checkpoint.safetensors"
METRICS_NAME = "metrics.csv"
BASE_COLUMNS = [
    "time_s",
    "env_frames",
    "learner_steps",
    "eval_return_mean",
    "eval_return_std",
    "eval_episodes",
    "learner_steps_per_s",
    "sampled_per_s",
    "inserted_per_s",
    "replay_size",
    "replay_inserted",
    "stale_updates",
    "params_version",
    "undecodable_items",
    "checkpoint_failures",
    "replay_servers_up",
    "eval_return_se",
    "eval_learner_steps",
    "eval_env_frames",
    "eval_time_s",
    "replay_ratio",
    "is_weight_mean",
    "invalid_items",
    "batch_wait_frac",
    *CPU_COLUMNS,
]
"""metrics.csv's fixed columns (the agent's metric_names follow). ``eval_*``: the evaluation that finished in
the interval, credited to the learner step, env frames and time at which its weights were taken
(``eval_learner_steps``, ``eval_env_frames``, ``eval_time_s``; plot against these, not the row's own).
``replay_ratio``: transitions sampled per transition inserted in the interval (the samples-per-insert the rate
limiter enforces when the preset sets one); ``is_weight_mean``: mean IS weight the learner trained with;
``undecodable_items`` / ``invalid_items``: sampled items erased because they did not decode / held values the
agent cannot train on (this run). ``batch_wait_frac``: the share of the interval's wall time the learner's loop
waited for a sampled batch (near 1: the learner is starved, by the actors through the rate limiter or by the
replay; near 0: the learner is the bottleneck). ``cpu_*``: CPU shares in cores of the learner, its evaluation
process, the replay servers and the actors on the learner's machine, and of the whole machine
(:mod:`apexrl.apex.cpu`); each actor's own share, ``cpu_actor<i>``, goes to the progress file and to the learner's
own TensorBoard file (``apexrl run --tensorboard`` mirrors the CSV's columns only)."""


_TEXT_KEYS = (
    "time_s",
    "learner_steps",
    "env_frames",
    "learner_steps_per_s",
    "replay_size",
    "inserted_per_s",
    "sampled_per_s",
    "eval_return_mean",
)
"""The metrics row's fields on the learner's stdout line (all of them go to its progress file)."""


def normalise_is_weights(weights: np.ndarray, mode: str) -> np.ndarray:
    """The IS weights the agent trains with. The replay returns ``(N·P(k))^-β / max_j (N·P(j))^-β`` over the
    whole replay (``global_min``: the max is the weight of its lowest-probability item); ``batch_max`` rescales
    them so that the batch's largest weight is 1."""
    if mode == "global_min":
        return weights
    if mode == "batch_max":
        return weights / weights.max()
    raise ValueError(f"unknown IS-weight normalisation {mode!r}")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return dev


class Learner:
    def __init__(self, config: LearnerConfig):
        from apexrl.envs import env_spec
        from apexrl.params.service import ParamServer

        self.config = config
        torch.set_num_threads(config.torch_threads)
        self.run_dir = config.run_dir or default_run_dir(config.env, config.agent, config.seed)
        make_private_dirs(self.run_dir)  # 0700 when created here
        self.checkpoint_path = os.path.join(self.run_dir, CHECKPOINT_NAME)
        self.device = resolve_device(config.device)
        self.env_spec = env_spec(config.env)
        agent_def = get_agent(config.agent)
        self.agent: Agent = agent_def.make_learner(self.env_spec, config.agent_config, self.device, config.seed)
        # What the agent's items are and how they are read (module docstring): only transitions have a
        # TransitionSpec; sequence items are the agent's own structure, made into its batch by the path.
        self.replay_path = agent_def.replay
        self.transition_spec: TransitionSpec | None = None
        self.frame_codec = None
        if self.replay_path.transitions:
            self.transition_spec = self.agent.transition_spec
            self.frame_codec = frame_codec(self.transition_spec)  # frame stacks stored once (Atari), else None
        per_item = self.replay_path.items_to_steps(config.agent_config)
        self._frames_per_item = per_item * self.env_spec.frames_per_step
        self._invalid = getattr(self.agent, "invalid_items", all_finite)  # the agent's value rules
        self._stop = threading.Event()
        self._stop_time: float | None = None
        self.checkpoint_failures = 0
        self.checkpoint_step: int | None = None  # learner step of the newest checkpoint written
        self.checkpoint_error: str | None = None  # why the last save failed, None after a success
        self.unconfirmed_updates = 0
        self.time_offset = 0.0  # wall time of earlier runs of this learner (resume)
        self.frames_base = 0  # env frames counted before the replay server's counters were reset
        self._last_inserted = 0
        self.undecodable_items = 0  # sampled items that did not decode, erased from the replay (this run)
        self.invalid_items = 0  # sampled items with values the agent cannot train on, erased (this run)
        self._erase_logged: set[str] = set()  # messages already logged
        self.best = BestCheckpoint(self.run_dir)  # the state of the best periodic evaluation, beside the last
        # What evaluations score with eval_weights="polyak" (apexrl.apex.polyak); None: the online weights.
        self.polyak = PolyakAverage(self.agent, config.polyak_tau) if config.eval_weights == "polyak" else None
        if config.resume:
            self._resume()
        elif os.path.exists(self.best.path):
            log.warning("%s is an earlier run's; this run's first evaluation replaces it", self.best.path)
        self.failure: str | None = None  # why the learner stopped on its own (its parameter service failed)
        raise_nofile_limit("learner")  # the parameter service holds one descriptor per actor
        self.params = ParamServer(
            bind=config.params_bind, port=config.params_port, curve=config.curve_dir, on_failure=self._service_failed
        ).start()
        # Every call without a table (sampler, updater, erase, remove_to_fit) goes to the path's table.
        self.replay = connect_replay(
            config.replay, timeout=config.replay_timeout, curve=config.curve_dir, table=self.replay_path.table
        )
        self.evaluator = Evaluator(config)
        self.report = ProgressReporter("learner", config.progress_path)
        self._csv: CSVWriter | None = None
        self._cpu = CPUMeter(self.run_dir)  # CPU shares of the run's processes on this machine
        self._wait_s = 0.0  # seconds the loop waited for a batch since the last metrics row
        self._board = None  # metrics rows to TensorBoard too (config.tensorboard)
        if config.tensorboard:
            from apexrl.tensorboard import MetricsBoard

            self._board = MetricsBoard(config.tensorboard)

    # ------------------------------------------------------------------------------------------ state

    def _meta(self, elapsed: float) -> dict[str, Any]:
        return {
            "format": 1,
            "agent": self.config.agent,
            "env": self.config.env,
            "learner_steps": int(self.agent.steps),
            "time_s": self.time_offset + elapsed,
            "frames_base": self.frames_base,
            "last_inserted": self._last_inserted,
            "env_frames": (self.frames_base + self._last_inserted) * self._frames_per_item,
            "agent_config": json.loads(json.dumps(dataclasses.asdict(self.config.agent_config), default=list)),
            "extra": self.config.extra,
            "eval_weights": self.config.eval_weights,
            **({"polyak_tau": self.polyak.tau} if self.polyak is not None else {}),
        }

    def _state(self) -> dict[str, torch.Tensor]:
        """What a checkpoint holds: the agent's state and, with eval_weights="polyak", the average."""
        state = self.agent.state_dict()
        return state if self.polyak is None else {**state, **self.polyak.state_dict()}

    def _eval_weights(self) -> dict[str, torch.Tensor]:
        """The weights evaluations score (config.eval_weights)."""
        return self.agent.policy_state_dict() if self.polyak is None else self.polyak.policy_state_dict()

    def _resume(self) -> None:
        if not os.path.exists(self.checkpoint_path):
            log.warning("--resume: no checkpoint at %s; starting from scratch", self.checkpoint_path)
            return
        tensors, meta = load_checkpoint(self.checkpoint_path)
        for key in ("agent", "env"):
            if meta.get(key) != getattr(self.config, key):
                raise ValueError(
                    f"checkpoint {self.checkpoint_path} is for {key}={meta.get(key)!r}, "
                    f"this learner has {key}={getattr(self.config, key)!r}"
                )
        tensors, average = split_average(tensors)
        self.agent.load_state_dict(tensors)
        self._resume_average(average)
        self.best.resume(self.config.agent, self.config.env)  # only a better evaluation replaces the run's best
        self.checkpoint_step = int(self.agent.steps)
        self.time_offset = float(meta.get("time_s", 0.0))
        self.frames_base = int(meta.get("frames_base", 0))
        self._last_inserted = int(meta.get("last_inserted", 0))
        log.info("resumed from %s at learner step %d", self.checkpoint_path, self.agent.steps)
        print(f"learner resumed from {self.checkpoint_path} at step {self.agent.steps}", flush=True)

    def _resume_average(self, average: dict[str, torch.Tensor]) -> None:
        """Continue the checkpoint's Polyak average, or start one at the resumed weights."""
        if self.polyak is None:
            if average:
                log.info("--resume: the checkpoint's Polyak average is not used (eval_weights online)")
            return
        if average:
            self.polyak.load(average)
        else:
            self.polyak.reset()
            log.warning("--resume: the checkpoint has no Polyak average; it starts at the resumed weights")

    def save(self, elapsed: float) -> bool:
        """Checkpoint now; False (warned, counted, the previous checkpoint intact) if it could not be written."""
        try:
            save_checkpoint(self.checkpoint_path, self._state(), self._meta(elapsed))
        except OSError as e:  # ENOSPC, EIO, EFBIG...: training goes on, the next interval tries again
            self.checkpoint_failures += 1
            self.checkpoint_error = f"{type(e).__name__}: {e}"
            kept = (
                f"the checkpoint of step {self.checkpoint_step} stays valid"
                if self.checkpoint_step is not None
                else "the previous checkpoint (if any) stays valid"
            )
            log.warning(
                "checkpoint at step %d not written to %s (%s); %s; retrying at the next interval",
                self.agent.steps,
                self.checkpoint_path,
                self.checkpoint_error,
                kept,
            )
            return False
        self.checkpoint_step = int(self.agent.steps)
        self.checkpoint_error = None
        return True

    def _service_failed(self, reason: str) -> None:
        """The parameter service stopped (its ZAP handler died): actors get no weights, so stop with an error
        (the final checkpoint is written as on SIGTERM)."""
        self.failure = reason
        self.stop()

    def stop(self) -> None:
        if self._stop_time is None:
            self._stop_time = time.monotonic()
        self._stop.set()

    def _time_left(self, default: float) -> float:
        """``default`` seconds, or what is left of the stop's grace period when stopping."""
        if self._stop_time is None:
            return default
        return max(0.0, min(default, self._stop_time + STOP_GRACE_S - time.monotonic()))

    # ------------------------------------------------------------------------------------------ replay

    def _replay_stats(self) -> dict[str, Any] | None:
        """The replay's STATS with the path's table's own counters (size, inserted, ...) in place of the reply's
        top-level ones, which describe the table ``default``; None when the replay did not answer."""
        try:
            stats = self.replay.stats()
        except AuthenticationError:  # a wrong key: waiting cannot fix it
            raise
        except ApexRLError as e:
            log.warning("replay stats unavailable: %s", e)
            return None
        return {**stats, **table_stats(stats, self.replay_path.table)}

    def _env_frames(self, stats: dict[str, Any] | None) -> int:
        if stats is not None:
            inserted = int(stats["inserted"])
            if inserted < self._last_inserted:  # the server restarted without its snapshot: counters reset
                self.frames_base += self._last_inserted
            self._last_inserted = inserted
        return (self.frames_base + self._last_inserted) * self._frames_per_item

    def _backlog_batches(self) -> int:
        """A synchronous path's whole batches already in its queue at the start (module docstring), when the
        learner will train on them at once (they reach ``min_replay_size``); else 0."""
        if not self.replay_path.synchronous(self.config.agent_config):
            return 0
        stats = self._replay_stats()
        held = int(stats["size"]) if stats else 0
        batch = int(self.config.agent_config.batch_size)
        if held < max(batch, self.config.min_replay_size):
            return 0
        log.info("the queue holds %d items from before: the first weights go out after their updates", held)
        return held // batch

    def _wait_for_replay(self) -> bool:
        need = self.config.min_replay_size
        next_log = 0.0
        while not self._stop.is_set():
            stats = self._replay_stats()
            size = int(stats["size"]) if stats else -1
            if size >= need:
                return True
            if time.monotonic() >= next_log:
                what = f"{size}/{need} transitions" if size >= 0 else "server unreachable"
                print(f"learner waiting for replay at {self.config.replay}: {what}", flush=True)
                next_log = time.monotonic() + 10.0
            self._stop.wait(0.5)
        return False

    # ------------------------------------------------------------------------------------------ loop

    def run(self) -> dict[str, Any]:
        cfg = self.config
        start = time.monotonic()
        publish_at = self.agent.steps + self._backlog_batches()  # the first publish: after the backlog's updates
        if publish_at == self.agent.steps:
            self.params.publish(self.agent.policy_state_dict())
        print(f"learner params on {self.params.endpoint} run_dir {self.run_dir}", flush=True)
        steps_at_start = self.agent.steps
        if not self._wait_for_replay():
            self.save(time.monotonic() - start)
            return self._summary(start, steps_at_start)
        train_start = time.monotonic()
        means = Mean()
        last_row = time.monotonic()
        last_eval = time.monotonic()
        stats = self._replay_stats()
        self._env_frames(stats)
        row_steps, row_inserted = self.agent.steps, (stats or {}).get("inserted", 0)
        sampler = (
            self._sequence_sampler()
            if not self.replay_path.transitions
            else self.replay.sampler(
                cfg.agent_config.batch_size,
                beta=cfg.beta,
                prefetch=cfg.prefetch,
                decode_threads=cfg.decode_threads,
                sample_threads=self._sample_threads(),
                timeout=1.0,
                **self._decode_hook(),
            )
        )
        updater = self.replay.updater()
        self._cpu.sample(self.evaluator.pid)  # the baseline of the first row's CPU shares
        self._wait_s = 0.0
        try:
            while not self._stop.is_set():
                waited = time.monotonic()
                try:
                    batch = sampler.next(timeout=0.5)
                except TimeoutError:
                    batch = None
                    if self.agent.steps < publish_at:  # the backlog is gone untrained (undecodable): publish
                        publish_at = self.agent.steps
                        self.params.publish(self.agent.policy_state_dict())
                self._wait_s += time.monotonic() - waited
                usable = self._usable(batch) if batch is not None else None
                if usable is not None:  # None also when every item of the batch was undecodable
                    fields, keys, weights = usable
                    weights = normalise_is_weights(weights, cfg.is_weights)
                    priorities, metrics = self.agent.update(fields, weights)
                    if self.polyak is not None:
                        self.polyak.update()
                    means.add(metrics)
                    means.add({"is_weight_mean": float(weights.mean())})
                    if self.replay_path.reader != "queue":  # a queue's items are gone once sampled
                        self._send_priorities(updater, keys, priorities)
                    steps = self.agent.steps
                    if steps % cfg.remove_to_fit_every == 0:
                        self._remove_to_fit()
                    if steps >= publish_at and (steps % cfg.publish_every == 0 or steps == publish_at):
                        self.params.publish(self.agent.policy_state_dict())
                    if steps % cfg.checkpoint_every == 0:
                        self.save(time.monotonic() - start)
                now = time.monotonic()
                if cfg.eval_every > 0 and now - last_eval >= cfg.eval_every and not self.evaluator.busy:
                    frames = self._env_frames(self._replay_stats())
                    self.evaluator.start(self._eval_weights(), self.agent.steps, frames, self.time_offset + now - start)
                    self.best.hold(self._state(), self._meta(now - start))  # written if it scores best
                    last_eval = now
                if now - last_row >= cfg.metrics_every:
                    stats = self._replay_stats()
                    row_steps, row_inserted = self._write_row(
                        now - start, now - last_row, means, stats, row_steps, row_inserted
                    )
                    last_row = now
                if cfg.max_steps and self.agent.steps >= cfg.max_steps:
                    break
                if cfg.max_minutes and now - train_start >= cfg.max_minutes * 60:
                    break
        finally:
            sampler.close()
            pending = updater.pending
            try:
                updater.close(timeout=self._time_left(5.0))
            except ApexRLError as e:
                log.warning("last priority updates not confirmed: %s", e)
            self.unconfirmed_updates = int(updater.counters().get("dropped", 0))
            if self.unconfirmed_updates:
                log.warning(
                    "stopping with %d of %d pending priority updates not confirmed by the replay server",
                    self.unconfirmed_updates,
                    pending,
                )
        now = time.monotonic()
        self._write_row(now - start, max(now - last_row, 1e-9), means, self._replay_stats(), row_steps, row_inserted)
        self.save(now - start)
        return self._summary(start, steps_at_start)

    def _sequence_sampler(self) -> Any:
        """The sampler of sequence items: the path's table, made into the agent's batch by the path. The
        ``"sequences"`` reader prefetches as the transition path does (sampling threads, native decode threads
        into a ring of preallocated batches); a queue is read a whole batch at a time (apexrl.apex.sequences)."""
        from apexrl.apex.sequences import SequenceDecoder, SequenceSampler

        cfg, path = self.config, self.replay_path
        make_batch = path.make_batch
        assert make_batch is not None  # ReplayPath requires it beside a sequences or queue reader
        agent_config = cfg.agent_config

        def to_batch(fields: Any, mask: np.ndarray, extras: Any) -> dict[str, np.ndarray]:
            return make_batch(fields, mask, extras, agent_config)

        if path.reader == "sequences":
            return self.replay.sampler(
                agent_config.batch_size,
                beta=cfg.beta,
                prefetch=cfg.prefetch,
                decode_threads=cfg.decode_threads,
                sample_threads=self._sample_threads(),
                timeout=1.0,
                decoder=SequenceDecoder(to_batch, self._invalid),
            )
        return SequenceSampler(
            self.replay,
            agent_config.batch_size,
            cfg.beta,
            to_batch,
            self._invalid,
            table=path.table,
            whole=path.reader == "queue",
        )

    def _sample_threads(self) -> int:
        """The sampler's threads: the config's, or one per replay server."""
        return self.config.sample_threads or max(1, len(getattr(self.replay, "endpoints", ())))

    def _decode_hook(self) -> dict[str, Any]:
        """The sampler's decode hook: sampled batches decode natively, with the GIL released, into a ring of
        preallocated batches: items in the spec's own layout by a ``BatchDecoder``, frame stacks stored once
        (Atari) rebuilt from their chunks by a ``FrameBatchDecoder`` (``frames.decode_valid`` is the Python
        reference of the same result)."""
        if self.frame_codec is None:
            return {"decoder": _LearnerDecoder(self)}
        native = FrameBatchDecoder(
            self.frame_codec, self.config.agent_config.batch_size, valid=True, pin_memory=self.device.type == "cuda"
        )
        return {"decoder": _LearnerDecoder(self, native)}

    def _checked(
        self, decoded: tuple[dict[str, np.ndarray], np.ndarray | None, str | None]
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None, str | None, np.ndarray | None, str | None]:
        """``decode_valid``'s triple plus which of the decoded items hold values the agent cannot train on."""
        fields, bad, message = decoded
        invalid, why = self._invalid(fields) if fields and len(next(iter(fields.values()))) else (None, None)
        return fields, bad, message, invalid, why

    def _usable(self, batch: Any) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray] | None:
        """(fields, keys, IS weights) of the items of ``batch`` that decoded into values the agent accepts (None
        if none did); the others are erased from the replay and counted."""
        fields, bad, message, invalid, why = batch.decoded
        if bad is None and invalid is None:
            return fields, batch.keys, batch.weights
        decoded = np.flatnonzero(~bad) if bad is not None else np.arange(len(batch.keys))
        erase = np.zeros(len(batch.keys), dtype=bool)
        if bad is not None:
            erase |= bad
            self.undecodable_items += int(bad.sum())
            self._log_erasure(int(bad.sum()), "undecodable", message)
        if invalid is not None:
            erase[decoded[invalid]] = True
            self.invalid_items += int(invalid.sum())
            self._log_erasure(int(invalid.sum()), "invalid", why)
            fields = {k: v[~invalid] for k, v in fields.items()}
        bad_keys = np.ascontiguousarray(batch.keys[erase])
        try:
            self.replay.erase(bad_keys)
        except ApexRLError as e:  # sampled again later, then erased again
            log.warning("could not erase %d item(s): %s", bad_keys.shape[0], e)
        keep = ~erase
        if not keep.any():
            return None
        return fields, batch.keys[keep], batch.weights[keep]

    def _log_erasure(self, n: int, kind: str, message: str | None) -> None:
        """One warning per distinct reason (at most 100): a hostile actor cannot flood the log."""
        key = f"{kind}: {message}"
        if key not in self._erase_logged and len(self._erase_logged) < 100:
            self._erase_logged.add(key)
            log.warning(
                "erasing %d %s item(s) from the replay (%s); training on the rest of the batch", n, kind, message
            )

    def _send_priorities(self, updater: Any, keys: np.ndarray, priorities: np.ndarray) -> None:
        try:
            updater.update(keys, priorities)
        except ApexRLError as e:  # advisory: a later update of the same keys supersedes a lost one
            log.warning("a priority update was not applied: %s", e)

    def _remove_to_fit(self) -> None:
        try:
            self.replay.remove_to_fit()
        except ApexRLError as e:
            log.warning("remove_to_fit failed: %s", e)

    def _write_row(
        self,
        elapsed: float,
        interval: float,
        means: Mean,
        stats: dict[str, Any] | None,
        row_steps: int,
        row_inserted: int,
    ) -> tuple[int, int]:
        metrics = means.pop()
        frames = self._env_frames(stats)
        inserted = int(stats["inserted"]) if stats else row_inserted
        steps = self.agent.steps
        sampled = (steps - row_steps) * self.config.agent_config.batch_size
        row: dict[str, Any] = {
            "time_s": round(self.time_offset + elapsed, 3),
            "env_frames": frames,
            "learner_steps": steps,
            "learner_steps_per_s": (steps - row_steps) / interval,
            "sampled_per_s": sampled / interval,
            "replay_ratio": sampled / (inserted - row_inserted) if inserted > row_inserted else None,
            "inserted_per_s": max(inserted - row_inserted, 0) / interval,
            "replay_size": int(stats["size"]) if stats else None,
            "replay_inserted": inserted if stats else None,
            "stale_updates": int(stats.get("stale_updates", 0)) if stats else None,
            "params_version": self.params.version,
            "undecodable_items": self.undecodable_items,
            "invalid_items": self.invalid_items,
            "checkpoint_failures": self.checkpoint_failures + self.best.failures,
            "replay_servers_up": int(stats.get("replay_servers_up", 1)) if stats else None,
            "batch_wait_frac": min(1.0, self._wait_s / interval),
            **self._cpu.sample(self.evaluator.pid),
        }
        self._wait_s = 0.0
        result = self.evaluator.pop_result()
        if result is not None:
            row.update(
                eval_return_mean=result.mean,
                eval_return_std=result.std,
                eval_return_se=result.se,
                eval_episodes=result.episodes,
                eval_learner_steps=result.learner_steps,
                eval_env_frames=result.env_frames,
                eval_time_s=round(result.time_s, 3),
            )
            self.best.offer(result)
        if self._csv is None:
            names = sorted(self.agent.metric_names)
            self._csv = CSVWriter(os.path.join(self.run_dir, METRICS_NAME), BASE_COLUMNS + names)
        row.update({k: v for k, v in metrics.items() if k in self._csv.columns})
        self._csv.write(row)
        per_actor = {f"cpu_{name}": share for name, share in self._cpu.actors.items()}  # not CSV columns
        if self._board is not None:
            self._board.add_metrics_row({**{c: row.get(c) for c in self._csv.columns}, **per_actor})
        self.report.emit({**row, **per_actor}, text_keys=_TEXT_KEYS)
        return steps, inserted

    def _summary(self, start: float, steps_at_start: int) -> dict[str, Any]:
        return {
            "learner_steps": self.agent.steps,
            "steps_this_run": self.agent.steps - steps_at_start,
            "seconds": time.monotonic() - start,
            "checkpoint": self.checkpoint_path,
            "checkpoint_step": self.checkpoint_step,
            "checkpoint_error": self.checkpoint_error,
            "checkpoint_failures": self.checkpoint_failures,
            "best_checkpoint": self.best.path if self.best.record is not None else None,
            "best_eval": self.best.record,
            "unconfirmed_updates": self.unconfirmed_updates,
            "undecodable_items": self.undecodable_items,
            "invalid_items": self.invalid_items,
            "failure": self.failure,
        }

    def close(self) -> None:
        self.evaluator.close(timeout=self._time_left(5.0))
        self.params.close()
        self.replay.close()
        self.report.close()
        if self._csv is not None:
            self._csv.close()
        if self._board is not None:
            self._board.close()


def run_learner(config: LearnerConfig) -> dict[str, Any]:
    """Build a :class:`Learner`; SIGTERM/SIGINT stop it after a checkpoint. Returns a summary."""
    learner = Learner(config)
    try:
        with StopOnSignal(learner.stop, [learner.replay.interrupt]):
            return learner.run()
    finally:
        learner.close()


class _LearnerDecoder:
    """The learner's sampler hook (its decode threads): natively (a BatchDecoder, or the FrameBatchDecoder given
    for frame stacks stored once) into the sampler's ring of preallocated batches (page-locked on a GPU), the
    good items' fields, which items did not decode, and which decoded ones the agent cannot train on. A slot is
    reused once the learner has taken the next batch: an update is done with its batch by then (its priorities
    are read back from the device)."""

    def __init__(self, learner: Learner, native: BatchDecoder | FrameBatchDecoder | None = None):
        self._learner = learner
        assert learner.transition_spec is not None  # sequence items are sampled through SequenceSampler
        self._native = native or BatchDecoder(
            learner.transition_spec,
            learner.config.agent_config.batch_size,
            valid=True,
            pin_memory=learner.device.type == "cuda",
        )

    def allocate(self) -> dict[str, np.ndarray]:
        return self._native.allocate()

    def decode_into(
        self, raw: Any, slot: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None, str | None, np.ndarray | None, str | None]:
        return self._learner._checked(self._native.decode_into(raw, slot))
