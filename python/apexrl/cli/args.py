"""argparse helpers shared by the command lines: validated numbers and endpoints, and the agent/preset flags
that the actor, the learner and the launcher resolve the same way (so actors' networks match the learner's)."""

from __future__ import annotations

import argparse
import copy
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from apexrl.cli.flags import Flag, Option
from apexrl.validate import Range

if TYPE_CHECKING:
    from apexrl.launch.plan import Overrides

__all__ = [
    "AGENT",
    "AGENT_FLAGS",
    "ENDPOINT_RE",
    "ENV",
    "LOG_LEVEL",
    "PRESET",
    "RECORD_DATASET",
    "REPLAY",
    "add_agent_arguments",
    "add_curve_arguments",
    "agent_overrides",
    "given_flags",
    "refuse_beside_plan",
    "float_arg",
    "agent_setting",
    "int_arg",
    "resolve_agent",
    "tcp_endpoint",
]


def int_arg(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """argparse ``type=``: an int in [lo, hi] (for a flag that sets no config field; one that does is a :class:`~apexrl.cli.flags.Flag`)."""
    return Range("int", lo, hi).parse


def float_arg(*, positive: bool = False, nonneg: bool = False, hi: float | None = None) -> Callable[[str], float]:
    """argparse ``type=``: a finite number, > 0 (``positive``) or >= 0 (``nonneg``), at most ``hi``."""
    return Range("float", 0.0 if positive or nonneg else None, hi, lo_open=positive).parse


def agent_setting(text: str) -> tuple[str, Any]:
    """argparse ``type=`` of ``--agent-set NAME=VALUE``: (name, value), the value read as JSON where it is JSON
    (``3``, ``1e-4``, ``true``, ``[256, 256]`` as a tuple, ``null`` as ``none``: off) and as a string otherwise
    (``rmsprop_tf``). Which names exist, and their ranges, the agent's config class checks."""
    import json

    name, sep, raw = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or not name.isidentifier() or not raw.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (e.g. num_samples=20), got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw.strip()
    if value is None:
        from apexrl.launch.presets import OFF

        value = OFF
    elif isinstance(value, list):
        value = tuple(value)
    elif isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{name}: a setting takes a number, a string, a bool or a list, got {raw!r}")
    return name, value


ENDPOINT_RE = re.compile(r"^tcp://(\[[0-9A-Fa-f:.]+\]|[^:/\[\]]+):(\d+)$")


def tcp_endpoint(text: str) -> str:
    """A ``tcp://HOST:PORT`` string with a port in [1, 65535]."""
    m = ENDPOINT_RE.match(text)
    if not m or not 1 <= int(m.group(2)) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not of the form tcp://HOST:PORT (port 1-65535)")
    return text


def add_curve_arguments(parser: argparse.ArgumentParser, *, binds: bool) -> None:
    """``--curve-dir`` (default ``$APEXRL_CURVE_DIR``) and, for a command that binds a service (``binds``),
    ``--insecure``; see apexrl.security and docs/running.md, section "Security"."""
    from apexrl.security import ENV_VAR, curve_dir_from_env

    g = parser.add_argument_group("security")
    g.add_argument(
        "--curve-dir",
        metavar="DIR",
        type=os.path.abspath,
        default=curve_dir_from_env(),
        help=f"CURVE-encrypt and authenticate with the keys of `apexrl keygen DIR` (default ${ENV_VAR}; "
        "unset: plain TCP)",
    )
    if binds:
        g.add_argument(
            "--insecure",
            action="store_true",
            help="allow binding beyond loopback without --curve-dir (only on a trusted network)",
        )


def given_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> dict[str, Any]:
    """``{dest: value}`` of only the flags present in ``argv``, parsed and checked by ``parser``'s own types
    (exit 2 through ``parser`` on a bad one). Required flags are not required here."""
    quiet = copy.deepcopy(parser)
    for action in quiet._actions:
        action.required = False
        action.default = argparse.SUPPRESS  # absent flags stay out of the namespace
    return vars(quiet.parse_args(argv))


def refuse_beside_plan(parser: argparse.ArgumentParser, argv: Sequence[str] | None, *allowed: str) -> None:
    """Exit 2 through ``parser`` when ``argv`` (None: the command line) gives flags beside ``--plan`` other than
    ``--log-level`` and ``allowed``: the plan holds every setting, so another flag would be ignored."""
    given = given_flags(parser, sys.argv[1:] if argv is None else argv)
    extra = sorted(set(given) - {"plan", "log_level", *allowed})
    if extra:
        parser.error(f"--plan takes every setting from the plan; also given: {', '.join(extra)}")


def _clip_arg(text: str) -> float | str:
    """A clip threshold: a finite number > 0, or ``none`` (off; :data:`apexrl.launch.presets.OFF`)."""
    from apexrl.launch.presets import OFF

    if text.strip().lower() == OFF:
        return OFF
    return float_arg(positive=True)(text)


def _on_off(text: str) -> bool:
    """``on`` / ``off`` (also true/false, yes/no, 1/0) as a bool."""
    value = text.strip().lower()
    if value in ("on", "true", "yes", "1"):
        return True
    if value in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


def _agent(text: str) -> str:
    from apexrl.agents import get_agent

    try:
        get_agent(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _preset(text: str) -> str:
    from apexrl.launch.presets import PRESETS

    if text not in PRESETS:
        raise argparse.ArgumentTypeError(f"unknown preset {text!r}; valid presets: {', '.join(PRESETS)}")
    return text


def _env(text: str) -> str:
    from apexrl.envs import env_spec

    try:
        env_spec(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    except ImportError as e:
        raise argparse.ArgumentTypeError(f"{text}: {e}") from None
    return text


def _agent_help() -> str:
    from apexrl.agents import AGENTS, agent_names

    described = "; ".join(f"{n}: {AGENTS[n].description}" for n in agent_names())
    return described + " (default: the preset's, or the first that accepts --env)"


def _preset_help() -> str:
    from apexrl.launch.presets import PRESETS

    return (
        f"settings preset: {', '.join(PRESETS)} (default: by agent and env family: "
        "apex-dqn-atari, cartpole, apex-dpg-control or pendulum; with --env and no --agent the "
        "agent comes from the action space: dqn for Discrete, dpg for Box, so a gym: task without "
        "a preset of its own runs with cartpole's or pendulum's settings)"
    )


AGENT = Option("--agent", _agent_help, type=_agent, default=None)
PRESET = Option("--preset", _preset_help, type=_preset, default=None)
ENV = Option(
    "--env",
    "environment FAMILY:ID: gym:<any gymnasium id> (gym:CartPole-v1, gym:HalfCheetah-v5, your own "
    "as gym:<module>:<id>), atari:<Game>, dmc:<domain>-<task>, or a family an apexrl.envs entry point "
    "adds; default: the preset's",
    type=_env,
    default=None,
)
REPLAY = Option(
    "--replay",
    "replay server, tcp://HOST:PORT (required); several (space-separated or repeated) for a replay spread over "
    "several servers",
    type=tcp_endpoint,
    nargs="+",
    action="extend",
    metavar="ENDPOINT",
)
"""``--replay`` of the learner and the actor."""
RECORD_DATASET = Option(
    "--record-dataset",
    "each actor records the episodes it plays (observations, actions, rewards, terminations, truncations) as a "
    "Minari dataset in DIR/actor<INDEX>/, appending to one there; pip install 'apexrl[offline]' (docs/offline.md)",
    metavar="DIR",
    type=os.path.abspath,
    default=None,
)
"""``--record-dataset`` of the actor and of ``apexrl run`` (which gives it to every actor)."""
LOG_LEVEL = Option(
    "--log-level", "logging level (stderr)", choices=("DEBUG", "INFO", "WARNING", "ERROR"), default="INFO"
)
"""``--log-level`` of every process."""


_OVERRIDES = "apexrl.launch.plan:AgentOverrides"  # imported when a parser is built: it imports the presets
AGENT_FLAGS = (
    Flag(_OVERRIDES, "n_step", "n of the n-step return"),
    Flag(_OVERRIDES, "gamma", "discount γ"),
    Flag(_OVERRIDES, "batch_size", "learner batch size", none="the preset's: 512 DQN, 256 DPG"),
    Flag(_OVERRIDES, "target_update_period", "learner steps between target-network copies"),
    Flag(
        _OVERRIDES,
        "lr",
        "DQN/R2D2/IMPALA: the learning rate (Adam's step size); the agents with one rate per network refuse it",
        metavar="LR",
    ),
    Flag(
        _OVERRIDES,
        "dqda_clip",
        "DPG/D4PG: clip every element of dQ/da to [-C, C] before it flows into the actor; none: off",
        metavar="C|none",
        parse=_clip_arg,
        none="the preset's; the Ape-X paper's 1",
    ),
    Flag(
        _OVERRIDES,
        "dqda_clip_norm",
        "DPG/D4PG: scale each sample's dQ/da to an L2 norm of at most C instead (Acme's D4PG: 1); none: off. Give "
        "--dqda-clip none with it unless the preset has no element clip",
        metavar="C|none",
        parse=_clip_arg,
    ),
    Flag(
        _OVERRIDES,
        "grad_clip_norm",
        "clip the global L2 norm of each network's gradient to C; none: off",
        metavar="C|none",
        parse=_clip_arg,
        none="the preset's: DQN 40 as the Ape-X paper; DPG/D4PG off, d4pg-acme 40 as Acme",
    ),
    Flag(
        _OVERRIDES,
        "actor_loss_state",
        "DPG/D4PG: state of the actor's loss -Q(s, pi(s)): obs (the transition's first, the papers') or next_obs "
        "(its last, Acme's D4PG)",
    ),
    Flag(
        _OVERRIDES,
        "actor_weights",
        "DPG/D4PG: weights the learner sends actors and evaluates: online, or target (its target networks, as "
        "Acme's D4PG)",
    ),
    Flag(_OVERRIDES, "noise_sigma_max", "D4PG: exploration noise std of actor 0", metavar="SIGMA"),
    Flag(
        _OVERRIDES,
        "noise_sigma_min",
        "D4PG: exploration noise std of the last actor; equal to --noise-sigma-max: the same sigma on every actor",
        metavar="SIGMA",
    ),
    Flag(_OVERRIDES, "noise_sigma_spacing", "D4PG: how the actors between share the sigma range"),
    Flag(
        _OVERRIDES,
        "obs_norm",
        "DPG/D4PG/TD3/SAC/MPO/DMPO: on: every network sees observations normalised by the running mean and "
        "variance the learner keeps of its sampled batches (clipped to 5 standard deviations), sent to actors and "
        "evaluation with the weights and saved in checkpoints; off: raw observations",
        metavar="on|off",
        parse=_on_off,
        none="the preset's; off in every paper preset",
    ),
    Flag(
        _OVERRIDES,
        "vtrace",
        "IMPALA: on: V-trace corrects for the lag between the acting and the learning policy (rho_bar = c_bar = 1); "
        "off: every importance ratio is 1, the n-step bootstrapped return",
        metavar="on|off",
        parse=_on_off,
        none="on",
    ),
)
"""The agent overrides (``--n-step``, ``--gamma``, ...) of every process of a run."""


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """--agent, --env, --preset, --seed and the agent overrides every process of a run must agree on."""
    from apexrl.apex.config import LearnerConfig

    g = parser.add_argument_group("agent (actors and learner must be given the same values)")
    for option in (AGENT, ENV, PRESET):
        option.add(g)
    Flag(LearnerConfig, "seed", "random seed").add(g)
    for flag in AGENT_FLAGS:
        flag.add_preset(g, shown="default: " + (flag.none or "the preset's"))


def agent_overrides(args: argparse.Namespace) -> Overrides:
    """The run-plan overrides of the agent flags (see :func:`add_agent_arguments`)."""
    from apexrl.launch.plan import AGENT_FIELDS, Overrides

    return Overrides(
        agent=args.agent,
        env=args.env,
        seed=args.seed,
        agent_fields={k: getattr(args, k) for k in AGENT_FIELDS if getattr(args, k) is not None},
    )


def resolve_agent(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[Any, Any]:
    """(preset, agent_config) from the parsed flags, filling ``args.agent``/``args.env`` as the run plan does;
    errors go through ``parser.error`` (exit 2)."""
    from apexrl.launch.plan import resolve_preset

    if args.preset is None and (args.agent is None or args.env is None):
        parser.error("give --agent and --env, or --preset")
    o = agent_overrides(args)
    try:
        preset, args.agent, args.env = resolve_preset(args.preset, o)
        config = preset.agent_config(**o.agent_fields)
    except (TypeError, ValueError) as e:
        parser.error(str(e))
    return preset, config


def exit_process(code: int) -> NoReturn:
    """Exit with ``code`` skipping the interpreter's teardown (the actor and learner CLIs, once closed).

    Tearing down torch, gymnasium and their thread pools took 1-3 s on a loaded 2-core machine: that would eat
    most of the 5 s a process has to exit after SIGTERM (docs/running.md). Everything is closed by then;
    logging and the standard streams are flushed here.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
