"""``mpo-small`` and ``dmpo-small``: MPO and DMPO sized for a 2-core machine as ``d4pg-small`` is (its replay, warm-up,
evaluation and actor settings); ``apexrl.launch.presets.PRESETS`` holds them. Every setting names its source;
what differs from Acme's agents is listed as unmatched."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apexrl.launch.presets import Preset

__all__ = ["mpo_presets"]

_NETWORKS = dict(actor_hidden=(256, 256), critic_hidden=(256, 256), obs_norm=True)
"""The small networks: a 256-256 policy and critic (the other small presets' sizes), observations normalised."""


def mpo_presets() -> dict[str, Preset]:
    """The MPO presets by name, built on the small presets' settings of :mod:`apexrl.launch.presets` (imported
    here, when that module asks for them, so that either module may be imported first)."""
    from apexrl.launch.presets import SMALL_LEARNER, SMALL_REPLAY, SMALL_SOURCES, SMALL_UNMATCHED, Preset

    unmatched = (
        SMALL_UNMATCHED[0],
        "a 256-256 policy (Acme: 256-256-256) and a 256-256 critic torso (Acme: a layer-normed 512-512-256 MLP): a "
        "CPU learner values num_samples x batch = 5120 sampled actions per update",
        *SMALL_UNMATCHED[2:4],
        "prioritized sampling with the critic's TD errors as priorities (Ape-X's); Acme's MPO samples uniformly",
        "the critic's torso is DPG's for MPO and D4PG's for DMPO (tanh, the action entering at the second layer), "
        "shared with those agents; Acme's concatenates observation and action at the input",
    )
    # Acme's MPO agents have d4pg-small's table: a million transitions, FIFO removal, 32 samples per insert.
    sources = dict(SMALL_SOURCES, capacity="Acme MPO", eviction="Acme MPO", samples_per_insert="Acme MPO")
    common = dict(
        env="dmc:walker-stand",
        replay=SMALL_REPLAY,
        learner=SMALL_LEARNER,
        actor=dict(flush_every=50, params_every_frames=400),
        actors=2,
        minutes=20.0,
    )
    presets = [
        Preset(
            name="mpo-small",
            description="MPO sized for 2 cores and 2 actors (Control Suite: walker-stand by default): 32 samples "
            "per insert, 256-256 networks, 20 action samples, observation normalisation",
            source="MPO (Abdolmaleki et al. 2018) with Acme's MPO defaults (decoupled KL bounds, action "
            "penalisation, n = 5, target copies every 100 updates), sized for a 2-core machine as d4pg-small; "
            "every change is listed as unmatched",
            agent="mpo",
            agent_overrides=dict(_NETWORKS),
            sources=sources,
            unmatched=unmatched,
            **common,  # type: ignore[arg-type]
        ),
        Preset(
            name="dmpo-small",
            description="DMPO sized for 2 cores and 2 actors (Control Suite: walker-stand by default): 32 samples "
            "per insert, 256-256 networks, support [0, 100], observation normalisation",
            source="DMPO (MPO with D4PG's categorical critic) with Acme's DMPO defaults, sized for a 2-core machine "
            "as d4pg-small; every change is listed as unmatched",
            agent="dmpo",
            # As d4pg-small: the returns-to-go of rewards in [0, 1] at gamma 0.99 lie in [0, 100].
            agent_overrides=dict(_NETWORKS, v_min=0.0, v_max=100.0),
            sources=dict(sources, v_min="apexrl", v_max="apexrl"),
            unmatched=(
                *unmatched,
                "support [0, 100], the returns-to-go of rewards in [0, 1] at gamma 0.99, rather than Acme's "
                "[-150, 150]",
            ),
            **common,  # type: ignore[arg-type]
        ),
    ]
    return {p.name: p for p in presets}
