"""Training from a Minari dataset with no actors: ``apexrl run --offline DATASET`` (Acme's offline setting).

Minari holds episodes; the replay holds the agent's n-step transitions. The run's *loader* child (in place of
the actors: ``python -m apexrl.cli.loader --plan RUN_DIR/plan.json``) reads the dataset's episodes, turns
each into n-step transitions with the run's n and γ through the actor's own adder
(:class:`apexrl.apex.nstep.NStepBuffer`; an episode that ends neither terminated nor truncated is cut as a
truncation, as an actor's last one), encodes them with the run's TransitionSpec, scores them with a freshly
initialised policy of the run's agent (``initial_priorities``, the actors' |δ|) and inserts them into the replay
server(s), then exits. The learner samples and trains as in any run, for the run's ``--minutes``/``--steps``;
metrics, checkpoints and the final evaluation are the usual ones.

DATASET (:func:`open_dataset`) is a Minari data directory (holding ``metadata.json``), a directory of them (what
``--record-dataset DIR`` writes: ``DIR/actor0``, ``DIR/actor1``, ...), a dataset directory of Minari's local store
(``<dataset>/data``), or the id of a dataset in that local store (``$MINARI_DATASETS_PATH``, default
``~/.minari/datasets``). Nothing is ever downloaded: ``minari download ID`` does that.

Before anything starts (:func:`check_offline`), the dataset is refused with the reason when its spaces are not
the task's (:func:`space_mismatch`: observations a Box of the task's shape and dtype, any float precision for a
float task; actions Discrete with the
task's count, or a Box of the task's size in [-1, 1], apexrl's action units), when a replay capacity given with
``--server-args '--capacity N'`` or ``--tables`` cannot hold all its transitions (one per step; without one, the
replay's capacity is the dataset's transition count: :func:`size_offline`), or when it holds fewer than a
``--min-replay-size`` given in
``--learner-args``. Without one, the learner's ``min_replay_size`` is the dataset's transition count: it starts
learning once the whole dataset is in the replay.

A restarted loader (or the loader of a resumed run, whose server restored its snapshot) inserts only what the
replay does not hold yet: transitions go in a fixed order and nothing is evicted (the capacity holds them all),
so the first ``size`` are there already.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from apexrl.offline import require_minari

__all__ = [
    "BATCH",
    "check_offline",
    "dataset_steps",
    "episode_transitions",
    "size_offline",
    "open_dataset",
    "space_mismatch",
]

log = logging.getLogger("apexrl.offline.loader")

BATCH = 500
"""Transitions per insert request."""


def open_dataset(source: str) -> list[Any]:
    """The Minari storages DATASET names (see the module docstring), in a fixed order; ValueError saying what
    was looked for when there is none, ImportError naming the extra when Minari is missing."""
    minari = require_minari()
    from minari.dataset.minari_storage import MinariStorage

    def read(path: str) -> Any:
        try:
            return MinariStorage.read(path)
        except Exception as e:  # noqa: BLE001 - Minari raises what json, h5py and gymnasium raise
            raise ValueError(f"--offline: {path} is not a readable Minari dataset: {type(e).__name__}: {e}") from None

    def is_data(path: str) -> bool:
        return os.path.isfile(os.path.join(path, "metadata.json"))

    if os.path.isdir(source):
        if is_data(source):
            return [read(source)]
        if is_data(os.path.join(source, "data")):
            return [read(os.path.join(source, "data"))]
        subdirs = sorted((d for d in os.listdir(source) if is_data(os.path.join(source, d))), key=_natural)
        if subdirs:
            return [read(os.path.join(source, d)) for d in subdirs]
        raise ValueError(
            f"--offline: {source} holds no Minari dataset (no metadata.json in it, in {source}/data or "
            "in its subdirectories)"
        )
    if os.path.exists(source):
        raise ValueError(f"--offline: {source} is a file, not a Minari dataset directory")
    # Minari's local store, as minari.storage.get_dataset_path finds it (without creating it, as that does).
    root = os.environ.get("MINARI_DATASETS_PATH") or os.path.join(os.path.expanduser("~"), ".minari", "datasets")
    path = os.path.join(root, source, "data")
    if not is_data(path):
        raise ValueError(
            f"--offline: {source!r} is neither a directory nor a dataset in Minari's local store "
            f"({os.path.dirname(path)} does not exist); apexrl never downloads: run `minari download "
            f"{source}` first (minari {minari.__version__})"
        )
    return [read(path)]


def _natural(name: str) -> tuple:
    digits = "".join(c for c in name if c.isdigit())
    return (name.rstrip("0123456789"), int(digits) if digits else -1, name)


def space_mismatch(observation_space: Any, action_space: Any, spec: Any) -> str | None:
    """Why a dataset with these gymnasium spaces cannot train on the task of EnvSpec ``spec`` (None: it can)."""
    from gymnasium import spaces

    want = (
        f"the task {spec.name} has observations of shape {tuple(spec.obs_shape)} and dtype {np.dtype(spec.obs_dtype)}"
    )
    if not isinstance(observation_space, spaces.Box):
        return f"its observation space is {observation_space}, not a Box; {want}"
    have, task = np.dtype(observation_space.dtype), np.dtype(spec.obs_dtype)
    # Floating observations of another precision (a gymnasium dataset's float64) are cast, as the apexrl
    # environment casts its own.
    same_kind = have == task or (np.issubdtype(have, np.floating) and np.issubdtype(task, np.floating))
    if tuple(observation_space.shape) != tuple(spec.obs_shape) or not same_kind:
        return f"its observations have shape {observation_space.shape} and dtype {observation_space.dtype}; {want}"
    if spec.num_actions is not None:
        if (
            not isinstance(action_space, spaces.Discrete)
            or int(action_space.n) != spec.num_actions
            or int(action_space.start) != 0
        ):
            return f"its action space is {action_space}; the task {spec.name} has Discrete({spec.num_actions})"
        return None
    if not isinstance(action_space, spaces.Box) or tuple(action_space.shape) != (spec.action_dim,):
        return f"its action space is {action_space}; the task {spec.name} has Box(-1, 1, ({spec.action_dim},))"
    if not (np.allclose(action_space.low, -1.0) and np.allclose(action_space.high, 1.0)):
        return (
            f"its actions are in [{np.min(action_space.low)}, {np.max(action_space.high)}]; apexrl's continuous "
            "actions are in [-1, 1] (the environment rescales them): rescale the dataset's actions first"
        )
    return None


def dataset_steps(storages: Sequence[Any], spec: Any, source: str) -> int:
    """The steps (= n-step transitions) of the storages; ValueError with the reason when one's spaces are not the
    task's or it holds no step."""
    total = 0
    for storage in storages:
        why = space_mismatch(storage.observation_space, storage.action_space, spec)
        if why is not None:
            raise ValueError(f"--offline: the dataset {storage.data_path} does not match the task: {why}")
        total += int(storage.total_steps)
    if total == 0:
        raise ValueError(f"--offline: {source} holds no steps")
    return total


def size_offline(source: str, server_args: dict[str, Any], learner_args: dict[str, Any], tables_given: bool) -> None:
    """What ``--offline`` sizes by itself, into the run's overrides before it is planned: the replay's capacity is
    the dataset's transition count (every transition fits, none is evicted) unless ``--capacity`` is given in
    ``--server-args`` (kept; refused with the reason when it cannot hold the dataset) or the run has tables
    (their capacities are the user's: :func:`check_offline` checks them); the learner's ``min_replay_size``
    becomes that count unless given. A dataset of no steps, or a ``--min-replay-size`` above its size, is left
    to :func:`check_offline`, whose refusal says so."""
    steps = sum(int(storage.total_steps) for storage in open_dataset(source))
    given = learner_args.get("min_replay_size")
    if steps == 0 or tables_given or (given is not None and given > steps):
        return
    capacity = server_args.get("capacity")
    if capacity is None:
        server_args["capacity"] = steps
    elif capacity < steps:
        raise ValueError(_too_small(source, steps, capacity, tables_given))
    if given is None:
        learner_args["min_replay_size"] = steps


def _too_small(source: str, steps: int, capacity: int, tables_given: bool) -> str:
    how = (
        "raise the capacity of the run's table in --tables (the agent's: 'default' unless its replay path names "
        "another)"
        if tables_given
        else f"raise it with --server-args '--capacity {steps}', or leave it out to size the replay to the dataset"
    )
    return (
        f"--offline: {source} gives {steps} transitions, more than the replay capacity {capacity}: "
        f"{how} (the loader never evicts)"
    )


def check_offline(p: Any, min_replay_given: bool = True, tables_given: bool = False) -> int:
    """Refuse a run plan's ``--offline`` dataset that cannot train this run (module docstring; the learner's
    ``min_replay_size`` only where ``min_replay_given``; ``tables_given``: the run's tables come from
    ``--tables`` or the preset, not from the table flags); the number of transitions it gives."""
    from apexrl.envs import env_spec

    source = p.run.offline
    steps = dataset_steps(open_dataset(source), env_spec(p.env), source)
    from apexrl.launch.plan import run_table

    capacity = sum(run_table(s, p.table).capacity for s in p.servers)  # the table the loader fills
    if steps > capacity:
        raise ValueError(_too_small(source, steps, capacity, tables_given))
    if min_replay_given and steps < p.learner.min_replay_size:
        raise ValueError(
            f"--offline: {source} gives {steps} transitions, fewer than the learner's min_replay_size "
            f"{p.learner.min_replay_size}: lower it with --learner-args '--min-replay-size {steps}'"
        )
    return steps


def episode_transitions(episode: dict, n: int, gamma: float) -> list:
    """One Minari episode's n-step transitions (:class:`apexrl.apex.nstep.Transition`), one per step, through the
    actor's adder; an episode whose last step neither terminated nor truncated ends as a truncation."""
    from apexrl.apex.nstep import NStepBuffer

    obs, actions = episode["observations"], episode["actions"]
    rewards, term, trunc = episode["rewards"], episode["terminations"], episode["truncations"]
    steps = len(rewards)
    if len(obs) != steps + 1 or len(actions) != steps:
        raise ValueError(
            f"episode {episode.get('id')}: {len(obs)} observations and {len(actions)} actions for "
            f"{steps} steps (expected {steps + 1} and {steps})"
        )
    buf = NStepBuffer(n, gamma)
    buf.add_first(obs[0])
    out: list = []
    for t in range(steps):
        if not buf.in_episode:  # a step after an end inside one Minari episode: a new episode starts there
            buf.add_first(obs[t])
        out.extend(buf.add(actions[t], float(rewards[t]), obs[t + 1], bool(term[t]), bool(trunc[t])))
    out.extend(buf.truncate())
    return out


def transition_batches(
    storages: Sequence[Any], n: int, gamma: float, spec: Any, skip: int = 0, batch: int = BATCH
) -> Iterator[dict[str, np.ndarray]]:
    """The storages' n-step transitions in their fixed order, stacked for ``spec`` in batches of ``batch``,
    without the first ``skip``."""
    from apexrl.apex.nstep import stack_transitions

    pending: list = []
    for storage in storages:
        for episode in storage.get_episodes(range(storage.total_episodes)):
            ts = episode_transitions(episode, n, gamma)
            if skip >= len(ts):
                skip -= len(ts)
                continue
            pending.extend(ts[skip:])
            skip = 0
            while len(pending) >= batch:
                yield stack_transitions(pending[:batch], spec)
                del pending[:batch]
    if pending:
        yield stack_transitions(pending, spec)


def load(p: Any, stop: threading.Event | None = None) -> int:
    """Insert the dataset of placed run plan ``p`` into its replay (what is not there yet); the count inserted
    (fewer when ``stop`` is set meanwhile)."""
    stop = stop or threading.Event()
    from apexrl.agents import get_agent
    from apexrl.envs import env_spec
    from apexrl.errors import ReplayTimeout, ServerClosedError
    from apexrl.launch.plan import actor_curve_dir
    from apexrl.replay.client.replay_client import ServerTimeoutError, table_stats
    from apexrl.replay.client.sharded import connect

    source, cfg = p.run.offline, p.learner.agent_config
    storages = open_dataset(source)
    total = dataset_steps(storages, env_spec(p.env), source)
    policy = get_agent(p.agent).make_policy(env_spec(p.env), cfg, 0, 1, p.seed)
    spec = policy.transition_spec
    from apexrl.replay.wire.frames import frame_codec, wire_spec

    codec = frame_codec(spec)  # Atari: items referencing each batch's frames, stored once (as the actors do)
    replay = connect(
        p.learner.replay,
        timeout=10.0,
        spec=wire_spec(spec),
        curve=actor_curve_dir(p.server.curve_dir),
        table=p.table,
    )
    try:
        held = int(table_stats(replay.stats(), p.table)["size"])
        if held >= total:
            log.info("the replay already holds %d items (the dataset gives %d): nothing to load", held, total)
            return 0
        log.info(
            "loading %d transitions of %s (n=%d, gamma=%g) after the %d the replay holds",
            total - held,
            source,
            cfg.n_step,
            cfg.gamma,
            held,
        )
        inserted, started = 0, time.monotonic()
        for batch in transition_batches(storages, cfg.n_step, cfg.gamma, spec, skip=held):
            priorities = np.asarray(policy.initial_priorities(batch), np.float64)
            if codec is not None:
                data, offsets, chunks = codec.encode(batch)
            else:
                (data, offsets), chunks = spec.encode(batch), None
            insert_id, delay = replay.next_insert_id(), 0.05
            while True:
                if stop.is_set():
                    return inserted
                try:
                    replay.insert(
                        priorities, data=data, offsets=offsets, timeout=5.0, insert_id=insert_id, chunks=chunks
                    )
                    break
                except (ServerTimeoutError, ReplayTimeout, ServerClosedError) as e:
                    log.warning("replay unavailable (%s); retrying", e)
                    if stop.wait(delay):
                        return inserted
                    delay = min(2 * delay, 2.0)
            inserted += len(priorities)
        log.info("loaded %d transitions in %.1f s", inserted, time.monotonic() - started)
        return inserted
    finally:
        replay.close()
