"""The MPO and DMPO presets as data (``apexrl.launch.presets.PRESETS`` holds them as ``Preset``s): each entry
holds the fields of ``Preset`` by name, ``replay`` the keyword arguments of its ``ReplaySettings``; both are
sized for a 2-core machine as d4pg-small (:mod:`apexrl.agents.small_presets`)."""

from __future__ import annotations

from typing import Any

from apexrl.agents.small_presets import SMALL_LEARNER, SMALL_REPLAY_SETTINGS, SMALL_SOURCES, SMALL_UNMATCHED

__all__ = ["DMPO_PRESETS", "MPO_PRESETS"]

MPO_SMALL_NETWORKS = dict(actor_hidden=(256, 256), critic_hidden=(256, 256), obs_norm=True)
"""mpo-small's and dmpo-small's networks: a 256-256 policy and critic (the other small presets' sizes), observations
normalised."""
MPO_SMALL_SOURCES = dict(SMALL_SOURCES, capacity="Acme MPO", eviction="Acme MPO", samples_per_insert="Acme MPO")
"""Acme's MPO agents have d4pg-small's table: a million transitions, FIFO removal, 32 samples per insert."""
MPO_SMALL_UNMATCHED = (
    SMALL_UNMATCHED[0],
    "a 256-256 policy (Acme: 256-256-256) and a 256-256 critic torso (Acme: a layer-normed 512-512-256 MLP): a "
    "CPU learner values num_samples x batch = 5120 sampled actions per update",
    *SMALL_UNMATCHED[2:4],
    "prioritized sampling with the critic's TD errors as priorities (Ape-X's); Acme's MPO samples uniformly",
    "the critic's torso is DPG's for MPO and D4PG's for DMPO (tanh, the action entering at the second layer), "
    "shared with those agents; Acme's concatenates observation and action at the input",
)

MPO_PRESETS: dict[str, dict[str, Any]] = {
    "mpo-small": dict(
        description="MPO sized for 2 cores and 2 actors (Control Suite: walker-stand by default): 32 samples "
        "per insert, 256-256 networks, 20 action samples, observation normalisation",
        source="MPO (Abdolmaleki et al. 2018) with Acme's MPO defaults (decoupled KL bounds, action "
        "penalisation, n = 5, target copies every 100 updates), sized for a 2-core machine as d4pg-small; "
        "every change is listed as unmatched",
        agent="mpo",
        env="dmc:walker-stand",
        agent_overrides=dict(MPO_SMALL_NETWORKS),
        replay=SMALL_REPLAY_SETTINGS,
        learner=SMALL_LEARNER,
        actor=dict(flush_every=50, params_every_frames=400),
        actors=2,
        minutes=20.0,
        sources=MPO_SMALL_SOURCES,
        unmatched=MPO_SMALL_UNMATCHED,
    ),
}
"""MPO's presets by name: the fields of ``apexrl.launch.presets.Preset``."""

DMPO_SAMPLES_PER_INSERT = 16.0
"""dmpo-small's replay ratio, half Acme's: on 2 cores the actors then make about twice the frames in 20 minutes for
about as many learner steps; on walker-stand, seed 0, the final evaluation was 614.7 against 530.5 at 32
(bench/README.md, "dmpo-small on walker-stand at 16 samples per insert"), and every later DMPO run used 16."""

DMPO_PRESETS: dict[str, dict[str, Any]] = {
    "dmpo-small": dict(
        description="DMPO sized for 2 cores and 2 actors (Control Suite: walker-stand by default): 16 samples "
        "per insert (tuned), 256-256 networks, support [0, 100], observation normalisation",
        source="DMPO (MPO with D4PG's categorical critic) with Acme's DMPO defaults, sized for a 2-core machine "
        "as d4pg-small; every change is listed as unmatched",
        agent="dmpo",
        env="dmc:walker-stand",
        # As d4pg-small: the returns-to-go of rewards in [0, 1] at gamma 0.99 lie in [0, 100].
        agent_overrides=dict(MPO_SMALL_NETWORKS, v_min=0.0, v_max=100.0),
        # The error buffer stays d4pg-small's (3200), as in the runs that chose the ratio.
        replay=dict(SMALL_REPLAY_SETTINGS, samples_per_insert=DMPO_SAMPLES_PER_INSERT),
        learner=SMALL_LEARNER,
        actor=dict(flush_every=50, params_every_frames=400),
        actors=2,
        minutes=20.0,
        sources=dict(MPO_SMALL_SOURCES, v_min="apexrl", v_max="apexrl", samples_per_insert="tuned"),
        unmatched=(
            "sized for 2 cores: 2 actor processes and 16 samples per insert, half Acme's 32: the actors make about "
            "twice the frames for about as many learner steps (walker-stand, seed 0: 614.7 against 530.5 at 32); a "
            "million-transition FIFO replay with Ape-X's prioritized sampling",
            *MPO_SMALL_UNMATCHED[1:],
            "support [0, 100], the returns-to-go of rewards in [0, 1] at gamma 0.99, rather than Acme's [-150, 150]",
        ),
    ),
}
"""DMPO's presets by name: the fields of ``apexrl.launch.presets.Preset``."""
