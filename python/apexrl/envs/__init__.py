"""Environments by name: `make_env("atari:Pong", seed)`, `env_spec(name)`, `env_names()`.

Names are "<family>:<id>":

- "gym:<id>"              gymnasium classic control (apexrl.envs.gym): CartPole-v1, Pendulum-v1, ...
- "atari:<Game>"          any ALE game, Ape-X preprocessing (apexrl.envs.atari); needs apexrl[atari]
- "dmc:<domain>-<task>"   any DeepMind Control Suite task (apexrl.envs.dmc); needs apexrl[control]

Importing this package is cheap: the family modules, and through them gymnasium, ale-py and dm-control,
are imported on first use of a name of that family. An unknown name raises ValueError listing the valid
names; a known family whose optional package is missing raises ImportError naming the pip extra.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from apexrl.envs.base import Env, EnvSpec, RenderError, StepResult

__all__ = ["Env", "EnvSpec", "RenderError", "StepResult", "make_env", "env_spec", "env_names"]

_FAMILIES = {"gym:": "apexrl.envs.gym", "atari:": "apexrl.envs.atari", "dmc:": "apexrl.envs.dmc"}


def _family(prefix: str) -> ModuleType:
    return importlib.import_module(_FAMILIES[prefix])


def _unknown(name: str) -> ValueError:
    forms = ", ".join(_family(p).describe() for p in _FAMILIES)
    return ValueError(f"unknown environment {name!r}; valid: {forms}")


def _resolve(name: str) -> tuple[ModuleType, str]:
    """Splits a name into its family module and the id within the family; ValueError if unknown."""
    if isinstance(name, str):
        for prefix in _FAMILIES:
            if name.startswith(prefix):
                family = _family(prefix)
                key = name[len(prefix):]
                # is_known raises ImportError (with the pip extra) when the family's package is missing.
                if family.is_known(key):
                    return family, key
                break
    raise _unknown(name)


def make_env(name: str, seed: int, *, evaluation: bool = False) -> Env:
    """A new, seeded environment; call `reset()` before stepping it. Same name and seed -> same episodes for
    the same actions. ``evaluation=True``: the evaluation protocol's episode limit where it differs from
    training (Atari: 108,000 frames instead of 50,000)."""
    family, key = _resolve(name)
    return family.make(key, seed, evaluation=evaluation)


def env_spec(name: str) -> EnvSpec:
    """The spec of `name` (cached per name; Atari and dmc load the game/task once to learn it)."""
    family, key = _resolve(name)
    return family.spec(key)


def env_names() -> list[str]:
    """Every valid name, for --help and error messages. Families whose optional package is not installed
    contribute none."""
    return [n for p in _FAMILIES for n in _family(p).names()]
