"""What each preset follows, printed from the presets themselves: the presets table of docs/running.md and the
epilog of ``apexrl run --help`` are both generated here, so neither can drift from ``apexrl.launch.presets``
(tests/launch/test_preset_table.py fails when docs/running.md differs from :func:`markdown`).

Every setting of a preset gets a value and a source: a setting the preset sets takes its source from the
preset's ``sources`` (or its ``"*"`` entry); one it leaves at the default takes the default's source
(``apexrl.agents.config.FIELD_SOURCES`` for the agent's fields, :data:`DEFAULT_SOURCES` for the rest). A
setting with no source is an error (:class:`ValueError`), not a blank cell.

Print the table with ``python -m apexrl.launch.preset_table`` and paste it between the ``presets:begin`` /
``presets:end`` marks of docs/running.md.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Iterator, Mapping
from typing import Any

from apexrl.launch.presets import PRESETS, Preset, ReplaySettings

__all__ = ["DEFAULT_SOURCES", "DELIBERATE_DIFFERENCES", "SOURCES", "epilog", "markdown", "settings"]

_BUILT_IN_SOURCES: dict[str, str] = {
    "Ape-X": "Horgan et al. 2018, Distributed Prioritized Experience Replay (ICLR 2018), appendix",
    "D4PG": "Barth-Maron et al. 2018, Distributed Distributional Deterministic Policy Gradients (ICLR 2018)",
    "Control Suite": "Tassa et al. 2018, DeepMind Control Suite (arXiv:1801.00690), its D4PG paragraph",
    "Acme": "Acme's D4PG (Hoffman et al. 2020, arXiv:2006.00979): the TensorFlow agent (acme/agents/tf/d4pg) "
    "and the settings its JAX agent shares (acme/agents/jax/d4pg: config, builder)",
    "Dueling": "Wang et al. 2016, Dueling Network Architectures for Deep Reinforcement Learning",
    "TD3": "Fujimoto et al. 2018, Addressing Function Approximation Error in Actor-Critic Methods (ICML 2018), "
    "its Table 3",
    "SAC": "Haarnoja et al. 2018, Soft Actor-Critic Algorithms and Applications (arXiv:1812.05905), its Table 1",
    "tuned": "tuned here on a 2-core machine; the measured results are in bench/README.md",
    "apexrl": "apexrl's own choice: the source the preset follows does not give it",
}
"""The sources of the presets written in :mod:`apexrl.launch.presets` and of the Ape-X agents' defaults."""


class _Sources(Mapping[str, str]):
    """:data:`SOURCES`: the built-in sources, then each registered agent's (``AgentDef.sources``) in the order
    the agents are registered (built-in agents and ``apexrl.agents`` entry points loaded first)."""

    def _sources(self) -> dict[str, str]:
        from apexrl.agents import AGENTS, agent_names

        agent_names()  # registers the built-in agents and loads the plugins
        sources = dict(_BUILT_IN_SOURCES)
        for agent in AGENTS.values():
            for key, text in agent.sources.items():
                if sources.setdefault(key, text) != text:
                    raise ValueError(f"agent {agent.name}: source {key!r} is already cited otherwise: {sources[key]}")
        return sources

    def __getitem__(self, key: str) -> str:
        return self._sources()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources())

    def __len__(self) -> int:
        return len(self._sources())


SOURCES: Mapping[str, str] = _Sources()
"""The sources a setting may name, with their citations: the built-in ones, then the agents'."""

DEFAULT_SOURCES: dict[str, str] = {
    "alpha": "Ape-X",
    "beta": "Ape-X",
    "is_weights": "apexrl",
    "final_eval_episodes": "Ape-X",
    "flush_every": "Ape-X",
    "params_every_frames": "Ape-X",
    "envs_per_actor": "Ape-X",
}
"""Sources of the defaults of the replay, learner and actor settings the table lists (the agent's are in
``FIELD_SOURCES``). ``is_weights``: the papers do not say how IS weights are normalised (docs/running.md)."""

DELIBERATE_DIFFERENCES: tuple[str, ...] = (
    "Actor loss state: the actor's loss -Q(s, pi(s)) is taken at the transition's first observation, as in the "
    "DPG and Ape-X papers; Acme's D4PG takes it at the n-step transition's last observation, which only "
    "d4pg-acme does (actor_loss_state=next_obs).",
    "Atari preprocessing: ale-py's max-pool of the last two frames, grey conversion and area resize to 84x84 "
    "(not the DQN code's luminance channel and bilinear resize), a frame stack that starts with zeros rather "
    "than copies of the first frame, 0 to 29 no-op frames at the start (apexrl.envs.atari).",
    "Life loss is not terminal: only game over ends an Atari episode, in training as in evaluation (the DQN "
    "code ended training episodes at a lost life; the Ape-X paper does not say).",
)
"""Differences from the sources that every preset keeps on purpose."""

_REPLAY = ("capacity", "eviction", "alpha", "alpha_evict", "samples_per_insert", "error_buffer")
_LEARNER = ("min_replay_size", "beta", "is_weights", "eval_episodes")
_ACTOR = ("flush_every", "params_every_frames", "envs_per_actor")


def _fmt(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, tuple):
        return "-".join(map(str, value))
    return str(value)


def _source(preset: Preset, name: str, set_by_preset: bool, default_source: str | None) -> str:
    if set_by_preset:
        source = preset.sources.get(name, preset.sources.get("*"))
    else:
        source = default_source
    if source is None:
        where = "the preset sets it and names no source" if set_by_preset else "its default has no source"
        raise ValueError(f"preset {preset.name}: setting {name} has no source ({where})")
    if source not in SOURCES:
        raise ValueError(
            f"preset {preset.name}: setting {name} names source {source!r}, not one of {', '.join(SOURCES)}"
        )
    return source


def _table_text(table: Any) -> str:
    """A preset's table in one line: its name and the fields it sets."""
    defaults = type(table)(table.name)
    changed = [
        f"{f.name}={getattr(table, f.name)!r}"
        for f in dataclasses.fields(table)
        if f.name not in ("name", "spec") and getattr(table, f.name) != getattr(defaults, f.name)
    ]
    return f"{table.name}({', '.join(changed)})"


def settings(preset: Preset) -> list[tuple[str, str, str, bool]]:
    """``(setting, value, source, set_by_preset)`` of every hyperparameter of ``preset``: the agent's config
    fields, then the replay's, the learner's and the actors' settings. ValueError when one has no source."""
    from apexrl.agents import get_agent
    from apexrl.agents.config import FIELD_SOURCES
    from apexrl.apex.config import ActorConfig, LearnerConfig

    rows: list[tuple[str, str, str, bool]] = []

    def add(name: str, value: Any, set_by_preset: bool, default_source: str | None) -> None:
        rows.append((name, _fmt(value), _source(preset, name, set_by_preset, default_source), set_by_preset))

    config_class = get_agent(preset.agent).config_class
    config = preset.agent_config()
    defaults = FIELD_SOURCES.get(config_class, {})
    for f in dataclasses.fields(config_class):
        add(f.name, getattr(config, f.name), f.name in preset.agent_overrides, defaults.get(f.name))
    base = ReplaySettings(capacity=preset.replay.capacity)
    if preset.tables is not None:  # the tables replace the replay settings
        add("tables", "; ".join(_table_text(t) for t in preset.tables), True, None)
    for name in _REPLAY if preset.tables is None else ():
        value = getattr(preset.replay, name)
        if name == "alpha_evict" and preset.replay.eviction != "prioritized":
            continue  # unused by FIFO eviction
        if name == "error_buffer" and preset.replay.samples_per_insert is None:
            continue  # no rate limiter
        # Every preset chooses its replay; only alpha has a default with a source (Ape-X's 0.6).
        set_here = name != "alpha" or value != base.alpha or name in preset.sources
        add(name, value, set_here, DEFAULT_SOURCES.get(name))
    for name in _LEARNER:
        set_here = name in preset.learner
        add(
            name,
            preset.learner[name] if set_here else _field_default(LearnerConfig, name),
            set_here,
            DEFAULT_SOURCES.get(name),
        )
    final = _field_default(Preset, "final_eval_episodes")
    add(
        "final_eval_episodes",
        preset.final_eval_episodes,
        preset.final_eval_episodes != final,
        DEFAULT_SOURCES["final_eval_episodes"],
    )
    for name in _ACTOR:
        set_here = name in preset.actor and preset.actor[name] != _field_default(ActorConfig, name)
        add(name, preset.actor.get(name, _field_default(ActorConfig, name)), set_here, DEFAULT_SOURCES.get(name))
    add("actors", preset.actors, True, None)
    return rows


def _field_default(cls: type, name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.default
    raise KeyError(f"{cls.__name__} has no field {name}")


def _cell(value: str, source: str) -> str:
    return f"`{value}` ({source})"


def markdown() -> str:
    """The presets section's generated part of docs/running.md: one table per agent (a row per setting, a
    column per preset, each cell the value and its source), what each preset follows and does not match, the
    deliberate differences and the sources."""
    out = ["| preset | agent | default env | follows |", "|---|---|---|---|"]
    for p in PRESETS.values():
        out.append(f"| `{p.name}` | {p.agent} | `{p.env}` | {p.source} |")
    agents = list(dict.fromkeys(p.agent for p in PRESETS.values()))
    for agent in agents:
        group = [p for p in PRESETS.values() if p.agent == agent]
        table = {p.name: settings(p) for p in group}
        names = [row[0] for row in table[group[0].name]]
        for p in group[1:]:
            names += [row[0] for row in table[p.name] if row[0] not in names]
        out += [
            "",
            f"**{agent}** (value and source of every setting; `-`: not used by that preset)",
            "",
            "| setting | " + " | ".join(f"`{p.name}`" for p in group) + " |",
            "|---|" + "---|" * len(group),
        ]
        for name in names:
            cells = []
            for p in group:
                row = next((r for r in table[p.name] if r[0] == name), None)
                cells.append("-" if row is None else _cell(row[1], row[2]))
            out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += ["", "What each preset does not match of the source it follows:", ""]
    for p in PRESETS.values():
        if p.unmatched:
            out.append(f"- `{p.name}`: " + "; ".join(p.unmatched) + ".")
    out += ["", "Deliberate differences, in every preset:", ""]
    out += [f"- {d}" for d in DELIBERATE_DIFFERENCES]
    out += ["", "Sources:", ""]
    out += [f"- {key}: {text}" for key, text in SOURCES.items()]
    return "\n".join(out) + "\n"


def _wrapped(text: str, indent: str) -> list[str]:
    return textwrap.wrap(
        text, width=110, initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False
    )


def epilog() -> str:
    """The ``apexrl run --help`` epilog: each preset, what it follows, the settings it sets with their sources
    and what it does not match; each agent's defaults with theirs; the deliberate differences; the sources."""
    from apexrl.agents import get_agent
    from apexrl.agents.config import FIELD_SOURCES

    width = max(map(len, PRESETS))
    lines = ["presets (every setting with its source in brackets; the defaults of each agent below):"]
    for p in PRESETS.values():
        lines.append(f"  {p.name:<{width}}  {p.description} [{p.env}, {p.actors} actors, {p.minutes:g} min]")
        lines += _wrapped(f"follows: {p.source}", "      ")
        sets = [f"{n}={v} [{s}]" for n, v, s, here in settings(p) if here]
        lines += _wrapped("sets: " + ", ".join(sets), "      ")
        for note in p.unmatched:
            lines += _wrapped(f"not matched: {note}", "      ")
    lines.append("agent defaults (a preset's other settings):")
    for agent in dict.fromkeys(p.agent for p in PRESETS.values()):
        config_class = get_agent(agent).config_class
        config, sources = config_class(), FIELD_SOURCES.get(config_class, {})
        fields = [
            f"{f.name}={_fmt(getattr(config, f.name))} [{sources.get(f.name, '?')}]"
            for f in dataclasses.fields(config_class)
        ]
        lines += _wrapped(f"{agent}: " + ", ".join(fields), "  ")
    lines += _wrapped(
        "replay, learner and actors: " + ", ".join(f"{k} [{v}]" for k, v in DEFAULT_SOURCES.items()), "  "
    )
    lines.append("deliberate differences (every preset):")
    for d in DELIBERATE_DIFFERENCES:
        lines += _wrapped(f"- {d}", "  ")
    lines.append("sources:")
    for key, text in SOURCES.items():
        lines += _wrapped(f"{key}: {text}", "  ")
    lines += ["", "with no flags: --preset cartpole (2 actors, 5 minutes)"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
