"""What the small-machine presets share (d4pg-small, td3-small, sac-small in :mod:`apexrl.launch.presets`;
mpo-small and dmpo-small in :mod:`apexrl.agents.mpo.presets`), as data: agents may not import the launcher, so
the replay is the keyword arguments of ``ReplaySettings`` rather than one."""

from __future__ import annotations

from typing import Any

__all__ = [
    "ACME_ERROR_BUFFER",
    "ACME_MIN_REPLAY",
    "ACME_SAMPLES_PER_INSERT",
    "SMALL_LEARNER",
    "SMALL_REPLAY_SETTINGS",
    "SMALL_SOURCES",
    "SMALL_UNMATCHED",
]

ACME_MIN_REPLAY = 1000
ACME_SAMPLES_PER_INSERT = 32.0
ACME_ERROR_BUFFER = ACME_MIN_REPLAY * 0.1 * ACME_SAMPLES_PER_INSERT
"""Acme's D4PG error buffer: min_replay_size x samples_per_insert_tolerance_rate (0.1) x samples_per_insert."""

SMALL_REPLAY_SETTINGS: dict[str, Any] = dict(
    capacity=1_000_000,
    eviction="fifo",
    samples_per_insert=ACME_SAMPLES_PER_INSERT,
    error_buffer=ACME_ERROR_BUFFER,
)
"""The small-machine presets' replay (d4pg-small, td3-small, sac-small, mpo-small, dmpo-small), the keyword
arguments of ``apexrl.launch.presets.ReplaySettings``: a million transitions evicted first in,
first out (Acme's table, and the TD3 and SAC papers' buffers), prioritized sampling (Ape-X's alpha 0.6: the
learner sends TD-error priorities) and Acme's D4PG replay ratio of 32 samples per insert. On 2 cores the
paper's Ape-X ratio (1.57) left the actors and the server 73-80 % of the CPU and the learner the rest; 32
samples per insert asks 8 agent steps per learner step of 256, so the learner gets most of the CPU and the rate
limiter holds the actors to it. Measured on a loaded 2-core machine (one torch thread): a learner step of
d4pg-small or td3-small takes about 10 ms and one of sac-small about 14 ms, and an actor's agent step on
walker-stand (policy and inserts included, bench/bench_actor.py) about 0.35 ms of a core, so 8 agent steps
(about 3 ms) leave the learner about three quarters of the CPU the run uses."""
SMALL_LEARNER = dict(
    min_replay_size=10_000,
    publish_every=10,
    checkpoint_every=10_000,
    eval_every=60.0,
    eval_episodes=10,
    metrics_every=10.0,
)
"""Learner settings of the small-machine presets: ten 1000-step Control Suite episodes before the first update
(at 32 samples per insert a smaller warm-up would sample its first items hundreds of times), an evaluation of
10 episodes (Ape-X's) every minute for the curve of a 20-minute run, a metrics row every 10 s."""
SMALL_SOURCES = dict(
    capacity="Acme",
    eviction="Acme",
    samples_per_insert="Acme",
    error_buffer="Acme",
    min_replay_size="apexrl",
    eval_episodes="Ape-X",
    actors="apexrl",
    obs_norm="apexrl",
    actor_hidden="apexrl",
    critic_hidden="apexrl",
)
SMALL_UNMATCHED = (
    "sized for 2 cores: 2 actor processes and Acme's replay ratio of 32 samples per insert, so that the learner "
    "rather than acting gets most of the CPU; a million-transition FIFO replay with Ape-X's prioritized sampling",
    "256-256 hidden layers: about half the multiply-adds of 400-300 per learner step on a CPU",
    "observations normalised by the learner's running mean and variance (--obs-norm on): Control Suite "
    "observations mix unit-scale positions with velocities of tens",
    "a warm-up of 10 000 transitions and an evaluation every minute, for 20-minute runs",
    "measured on 2 cores (bench/README.md, the small-machine presets on walker-stand and cheetah-run): "
    "d4pg-small over 3 seeds of 20 minutes on each; td3-small and sac-small in a 4-minute screen on walker-stand, "
    "where d4pg-small led",
)
