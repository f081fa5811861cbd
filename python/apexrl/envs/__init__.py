"""Environments by name: `make_env("atari:Pong", seed)`, `env_spec(name)`, `env_families()`, `env_names()`.

Names are "<family>:<id>":

- "gym:<id>"              any id ``gymnasium.make`` accepts (apexrl.envs.gym): CartPole-v1, HalfCheetah-v5 (MuJoCo,
                          needs apexrl[control]), or a user's own in gymnasium's "module:EnvId" form
                          ("gym:my_pkg.envs:MyEnv-v0" imports my_pkg.envs, which registers MyEnv-v0)
                          "gym:apexrl.envs.masked:MaskedCartPole-v1" is CartPole without its velocities
                          (apexrl.envs.masked: a partially observed task for recurrent agents)
- "atari:<Game>"          any ALE game, Ape-X preprocessing (apexrl.envs.atari); needs apexrl[atari]
- "dmc:<domain>-<task>"   any DeepMind Control Suite task (apexrl.envs.dmc); needs apexrl[control]
- "<family>:<id>"         a family another distribution registers with an ``apexrl.envs`` entry point naming an
                          :class:`~apexrl.envs.base.EnvFamily` (entry point name = family name)

Importing this package is cheap: the family modules, and through them gymnasium, ale-py and dm-control,
are imported on first use of a name of that family. An unknown name raises ValueError listing the families with
examples; a known family whose optional package is missing raises ImportError naming the pip extra; an
environment whose spaces apexrl cannot handle raises ValueError (UnsupportedSpaceError) naming the space.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Sequence

from apexrl.envs.base import (
    Env,
    EnvFamily,
    EnvSpec,
    RenderError,
    SerialVecEnv,
    StepResult,
    UnknownEnvError,
    UnsupportedSpaceError,
    VecEnv,
    VecStep,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Env",
    "EnvFamily",
    "EnvSpec",
    "RenderError",
    "SerialVecEnv",
    "StepResult",
    "UnknownEnvError",
    "UnsupportedSpaceError",
    "VecEnv",
    "VecStep",
    "env_families",
    "env_names",
    "env_spec",
    "get_family",
    "make_env",
    "make_vec_env",
]

ENTRY_POINT_GROUP = "apexrl.envs"
"""Entry points of this group name an :class:`EnvFamily` of another distribution (loaded on first lookup)."""

_BUILTIN = {"gym": "apexrl.envs.gym", "atari": "apexrl.envs.atari", "dmc": "apexrl.envs.dmc"}
_plugins: dict[str, EnvFamily] | None = None
_lock = threading.Lock()


def _load_plugins() -> dict[str, EnvFamily]:
    global _plugins
    with _lock:
        if _plugins is None:
            from importlib.metadata import entry_points

            found: dict[str, EnvFamily] = {}
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                if ep.name in _BUILTIN:
                    raise TypeError(f"entry point {ep.name} = {ep.value}: {ep.name!r} is a built-in environment family")
                family = ep.load()
                if not isinstance(family, EnvFamily) or family.name != ep.name:
                    raise TypeError(f"entry point {ep.name} = {ep.value} must name an EnvFamily called {ep.name!r}")
                found[ep.name] = family
            _plugins = found
        return _plugins


def _family_names() -> list[str]:
    return [*_BUILTIN, *_load_plugins()]


def get_family(name: str) -> EnvFamily:
    """The family called ``name`` (built-in or plugged in); ValueError listing the families otherwise."""
    if name in _BUILTIN:
        return importlib.import_module(_BUILTIN[name]).FAMILY
    plugins = _load_plugins()
    if name not in plugins:
        raise ValueError(f"unknown environment family {name!r}; families: {', '.join(_family_names())}")
    return plugins[name]


def env_families() -> list[str]:
    """One line per family: its name pattern with examples (for --help and error messages)."""
    return [get_family(f).describe() for f in _family_names()]


def _unknown(name: object, why: str = "") -> ValueError:
    forms = "; ".join(env_families())
    return ValueError(f"unknown environment {name!r}{': ' + why if why else ''}; names are FAMILY:ID, one of: {forms}")


def _resolve(name: str) -> tuple[EnvFamily, str]:
    """Splits a name into its family and the id within the family; ValueError if there is no such family."""
    if isinstance(name, str) and ":" in name:
        prefix, key = name.split(":", 1)
        if key and (prefix in _BUILTIN or prefix in _load_plugins()):
            return get_family(prefix), key
    raise _unknown(name)


def make_env(name: str, seed: int, *, evaluation: bool = False) -> Env:
    """A new, seeded environment; call `reset()` before stepping it. Same name and seed -> same episodes for
    the same actions. ``evaluation=True``: the evaluation protocol's episode limit where it differs from
    training (Atari: 108,000 frames instead of 50,000)."""
    family, key = _resolve(name)
    try:
        return family.make(key, seed, evaluation)
    except UnknownEnvError as e:
        raise _unknown(name, str(e)) from None


def make_vec_env(name: str, seeds: Sequence[int]) -> VecEnv:
    """K training environments of ``name`` stepped together (a vectorised actor's), environment ``j`` seeded with
    ``seeds[j]`` and producing the episodes of ``make_env(name, seeds[j])``. The family's batched backend where it
    has one (Atari: ale-py's vector environment with its threads), else :class:`SerialVecEnv`."""
    family, key = _resolve(name)
    seeds = list(seeds)
    if not seeds:
        raise ValueError("make_vec_env needs at least one seed")
    try:
        if family.make_vector is not None and len(seeds) > 1:
            return family.make_vector(key, seeds)
        envs: list[Env] = []
        try:
            for seed in seeds:
                envs.append(family.make(key, seed, False))
        except BaseException:
            for env in envs:
                env.close()
            raise
        return SerialVecEnv(envs)
    except UnknownEnvError as e:
        raise _unknown(name, str(e)) from None


def env_spec(name: str) -> EnvSpec:
    """The spec of `name` (cached per name by the family where learning it is costly)."""
    family, key = _resolve(name)
    try:
        return family.spec(key)
    except UnknownEnvError as e:
        raise _unknown(name, str(e)) from None


def env_names() -> list[str]:
    """Example names of every family, for --help and docs: a family such as ``gym`` accepts far more ids than can
    be listed (see :func:`env_families`). Families whose optional package is not installed contribute none."""
    return [n for f in _family_names() for n in get_family(f).examples()]
