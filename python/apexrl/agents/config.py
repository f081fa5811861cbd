"""Agent hyper-parameters. DQN's and DPG's defaults are the Ape-X paper's (Horgan et al. 2018, appendix); D4PG's
are the D4PG paper's where it gives them and Acme's elsewhere (D4PGConfig); TD3's and SAC's are their papers'
(Fujimoto et al. 2018; Haarnoja et al. 2018, Soft Actor-Critic Algorithms and Applications). Each preset of
``apexrl.launch.presets`` says which source each of its settings follows.

All configs are frozen dataclasses: make small-task presets with ``dataclasses.replace(DQNConfig(), lr=1e-3)``.
Invalid values raise ValueError at construction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


def _check_positive_ints(cfg: object, *names: str) -> None:
    for name in names:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{type(cfg).__name__}.{name} must be an int >= 1, got {v!r}")


def _check_positive_floats(cfg: object, *names: str, allow_none: bool = False) -> None:
    for name in names:
        v = getattr(cfg, name)
        if v is None and allow_none:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
            raise ValueError(f"{type(cfg).__name__}.{name} must be a finite number > 0, got {v!r}")


def _check_bool(cfg: object, *names: str) -> None:
    for name in names:
        if not isinstance(getattr(cfg, name), bool):
            raise ValueError(f"{type(cfg).__name__}.{name} must be true or false, got {getattr(cfg, name)!r}")


def _check_nonneg_floats(cfg: object, *names: str) -> None:
    for name in names:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{type(cfg).__name__}.{name} must be a finite number >= 0, got {v!r}")


def _check_unit(cfg: object, *names: str) -> None:
    for name in names:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise ValueError(f"{type(cfg).__name__}.{name} must be in [0, 1], got {v!r}")


def _check_choice(cfg: object, name: str, choices: tuple[str, ...]) -> None:
    v = getattr(cfg, name)
    if v not in choices:
        raise ValueError(f"{type(cfg).__name__}.{name} must be one of {', '.join(choices)}; got {v!r}")


ACTOR_LOSS_STATES = ("obs", "next_obs")
"""``_ActorCriticConfig.actor_loss_state`` values."""
ACTOR_WEIGHTS = ("online", "target")
"""``_ActorCriticConfig.actor_weights`` values."""
SIGMA_SPACINGS = ("geometric", "linear")
"""``D4PGConfig.noise_sigma_spacing`` values."""


def _check_layers(cfg: object, *names: str) -> None:
    for name in names:
        v = getattr(cfg, name)
        if not isinstance(v, tuple) or not all(isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in v):
            raise ValueError(f"{type(cfg).__name__}.{name} must be a tuple of positive ints, got {v!r}")


@dataclass(frozen=True)
class DQNConfig:
    """Ape-X DQN: dueling double-Q network, n-step targets, centered RMSProp (paper defaults)."""

    n_step: int = 3
    """n of the n-step return R = sum_{k<n} gamma^k r_k used by actors and the learner's target."""
    gamma: float = 0.99
    """Discount per agent step."""
    batch_size: int = 512
    """Transitions per learner update (the learner samples this many from replay)."""
    lr: float = 0.00025 / 4
    """Learning rate of centered RMSProp."""
    rms_decay: float = 0.95
    """RMSProp smoothing constant (torch's ``alpha``)."""
    rms_eps: float = 1.5e-7
    """RMSProp epsilon."""
    rms_centered: bool = True
    """Centered RMSProp (normalise by the variance, not the second moment, of the gradient)."""
    optimizer: str = "rmsprop"
    """``rmsprop``: PyTorch's RMSprop (divides by sqrt(v) + eps); ``rmsprop_tf``: TensorFlow's, as in the paper
    (divides by sqrt(v + eps), mean square starting at 1; apexrl.agents.optim.TFRMSProp)."""
    grad_clip_norm: float | None = 40.0
    """Clip the global gradient norm to this; None: no clipping."""
    target_update_period: int = 2500
    """Learner updates between hard copies of the online network into the target network."""
    priority_eps: float = 1e-6
    """Added to |TD error| so that every priority is > 0."""
    huber_delta: float | None = None
    """None: the paper's loss 1/2 delta^2; a float: Huber loss with this threshold (acme uses 1.0)."""
    hidden: tuple[int, ...] = (512,)
    """Hidden layers (ReLU) of the MLP torso for vector observations; the dueling streams are linear on top."""
    atari_stream_hidden: int = 512
    """Hidden units of each dueling stream on the Nature-DQN torso (Wang et al. 2016)."""
    epsilon_base: float = 0.4
    """Exploration ladder: actor i of N uses epsilon_base ** (1 + epsilon_alpha * i / (N - 1))."""
    epsilon_alpha: float = 7.0
    """Exponent range of the exploration ladder (see epsilon_base)."""
    eval_epsilon: float = 0.001
    """Epsilon of evaluation episodes (``act(explore=False)``): 0.001 is the Ape-X / Rainbow evaluation
    protocol, which keeps a deterministic policy from looping forever; 0: strictly greedy."""

    def __post_init__(self) -> None:
        _check_positive_ints(self, "n_step", "batch_size", "target_update_period", "atari_stream_hidden")
        _check_unit(self, "gamma", "rms_decay", "epsilon_base", "eval_epsilon")
        _check_positive_floats(self, "lr", "rms_eps", "priority_eps", "epsilon_alpha")
        _check_positive_floats(self, "grad_clip_norm", "huber_delta", allow_none=True)
        if self.optimizer not in ("rmsprop", "rmsprop_tf"):
            raise ValueError(f"DQNConfig.optimizer must be 'rmsprop' or 'rmsprop_tf', got {self.optimizer!r}")
        _check_layers(self, "hidden")


@dataclass(frozen=True)
class _ActorCriticConfig:
    """What DPG and D4PG share: deterministic actor, critic, n-step targets, Adam, hard target copies."""

    n_step: int = 5
    """n of the n-step return (5: D4PG's, Barth-Maron et al. 2018; the Ape-X paper's DPG uses 3, as DQN)."""
    gamma: float = 0.99
    """Discount per agent step."""
    batch_size: int = 256
    """Transitions per learner update."""
    actor_lr: float = 1e-4
    """Adam learning rate of the actor (policy) network."""
    critic_lr: float = 1e-4
    """Adam learning rate of the critic network."""
    adam_eps: float = 1e-8
    """Adam epsilon, both optimisers."""
    critic_hidden: tuple[int, int] = (400, 300)
    """Critic torso: obs -> 400 -> tanh -> [concat action] -> 300 -> tanh -> head (DPG: 1 value; D4PG: atoms)."""
    actor_hidden: tuple[int, ...] = (300, 200)
    """Actor layers: obs -> 300 -> tanh -> 200 -> tanh -> action_dim -> tanh."""
    target_update_period: int = 100
    """Learner updates between hard copies of actor and critic into their target networks."""
    priority_eps: float = 1e-6
    """Added to every new priority (DPG: |TD error|; D4PG: the KL divergence) so that it is > 0."""
    dqda_clip: float | None = 1.0
    """Clip every *element* of dQ/da -- the gradient the critic passes into the actor's action -- to [-c, c]
    (the Ape-X paper's "gradient used to update the actor network is clipped to [-1, 1], element-wise", trfl's
    ``dpg(dqda_clipping=c)``); None: no element-wise clipping. Exclusive with ``dqda_clip_norm``."""
    dqda_clip_norm: float | None = None
    """Scale each sample's dQ/da down to an L2 norm of at most c (trfl's ``dpg(dqda_clipping=c,
    clip_norm=True)``, which Acme's TensorFlow D4PG uses with c = 1); None: no norm clipping. Exclusive with
    ``dqda_clip``."""
    actor_grad_clip: float | None = None
    """Also clip every element of the actor's *parameter* gradient to [-c, c] (an earlier reading of the
    paper, kept by the tuned presets); None (default): no clipping."""
    grad_clip_norm: float | None = None
    """Clip the global L2 norm of each network's parameter gradient -- the critic's, and the actor's after
    ``dqda_clip``/``actor_grad_clip`` -- to this (Acme's D4PG: 40 on both); None (default): no clipping."""
    actor_loss_state: str = "obs"
    """State at which the actor ascends Q(s, pi(s)): ``obs``, the transition's first observation (the DPG and
    Ape-X papers' s_t), or ``next_obs``, its last one (the state the n-step target bootstraps from; Acme's D4PG
    learner computes the policy loss there)."""
    actor_weights: str = "online"
    """Weights the learner sends to actors (and evaluates): ``online``, the networks it trains, or ``target``,
    their target copies (Acme's D4PG learner serves its target networks to its actors)."""
    obs_norm: bool = False
    """Normalise observations by the running mean and variance the learner keeps of its sampled batches,
    shipped to actors with the weights (apexrl.agents.normalize). Off: the papers feed raw observations."""

    def __post_init__(self) -> None:
        _check_bool(self, "obs_norm")
        _check_positive_ints(self, "n_step", "batch_size", "target_update_period")
        _check_unit(self, "gamma")
        _check_positive_floats(self, "actor_lr", "critic_lr", "adam_eps", "priority_eps")
        _check_positive_floats(
            self, "actor_grad_clip", "dqda_clip", "dqda_clip_norm", "grad_clip_norm", allow_none=True
        )
        _check_layers(self, "critic_hidden", "actor_hidden")
        if len(self.critic_hidden) != 2:
            raise ValueError(
                f"{type(self).__name__}.critic_hidden must have two layers (the action enters the "
                f"second), got {self.critic_hidden}"
            )
        if self.dqda_clip is not None and self.dqda_clip_norm is not None:
            raise ValueError(
                f"{type(self).__name__}: set dqda_clip (element-wise) or dqda_clip_norm (per-sample "
                f"L2 norm), not both; got {self.dqda_clip!r} and {self.dqda_clip_norm!r}"
            )
        _check_choice(self, "actor_loss_state", ACTOR_LOSS_STATES)
        _check_choice(self, "actor_weights", ACTOR_WEIGHTS)


@dataclass(frozen=True)
class DPGConfig(_ActorCriticConfig):
    """Ape-X DPG: deterministic actor, Q critic, n-step targets, Adam, hard target copies (paper defaults)."""

    n_step: int = 3
    """n of the n-step return: 3, the Ape-X paper's ("hyperparameters are otherwise as per DQN"; 5 is D4PG's)."""

    noise_sigma: float = 0.3
    """Std of the Gaussian exploration noise added to actions by actors (none in evaluation)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if (
            isinstance(self.noise_sigma, bool)
            or not isinstance(self.noise_sigma, (int, float))
            or not (math.isfinite(self.noise_sigma) and self.noise_sigma >= 0)
        ):
            raise ValueError(f"DPGConfig.noise_sigma must be a finite number >= 0, got {self.noise_sigma!r}")


@dataclass(frozen=True)
class D4PGConfig(_ActorCriticConfig):
    """D4PG (Barth-Maron et al. 2018): DPG's actor and hyper-parameters (n=5, batch 256, Adam 1e-4 -- the D4PG
    paper's), a categorical critic (51 atoms on [-150, 150]: Acme's Control Suite support) and Gaussian noise of
    std 0.3 on every actor (Acme's); the presets ``apex-d4pg-control`` and ``d4pg-acme`` set the Control Suite
    paper's and Acme's settings in full."""

    num_atoms: int = 51
    """Atoms of the categorical value distribution, evenly spaced on [v_min, v_max]."""
    v_min: float = -150.0
    """Lowest atom (Acme's Control Suite value; returns-to-go there lie in [0, 100])."""
    v_max: float = 150.0
    """Highest atom."""
    noise_sigma_max: float = 0.3
    """Exploration ladder: actor 0 of N adds Gaussian noise of this std (also the only actor's, N = 1)."""
    noise_sigma_min: float = 0.3
    """Actor N - 1's noise std; the actors between are spaced as ``noise_sigma_spacing`` says
    (``apexrl.agents.d4pg.sigma_ladder``). Equal to ``noise_sigma_max`` (the default, Acme's 0.3): every actor
    the same sigma."""
    noise_sigma_spacing: str = "geometric"
    """How the actors between share the range: ``geometric`` (equal ratios, as the DQN epsilon ladder) or
    ``linear`` (equal steps)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive_ints(self, "num_atoms")
        _check_choice(self, "noise_sigma_spacing", SIGMA_SPACINGS)
        _check_positive_floats(self, "noise_sigma_max", "noise_sigma_min")
        if self.num_atoms < 2:
            raise ValueError(f"D4PGConfig.num_atoms must be >= 2, got {self.num_atoms}")
        for name in ("v_min", "v_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"D4PGConfig.{name} must be a finite number, got {v!r}")
        if not self.v_min < self.v_max:
            raise ValueError(f"D4PGConfig needs v_min < v_max, got v_min={self.v_min!r}, v_max={self.v_max!r}")
        if self.noise_sigma_min > self.noise_sigma_max:
            raise ValueError(
                f"D4PGConfig needs noise_sigma_min <= noise_sigma_max, got {self.noise_sigma_min!r} > "
                f"{self.noise_sigma_max!r}"
            )


@dataclass(frozen=True)
class TD3Config:
    """TD3 (Fujimoto et al. 2018, Addressing Function Approximation Error in Actor-Critic Methods): clipped
    double Q, delayed policy updates, target policy smoothing; the paper's settings (its Table 3)."""

    n_step: int = 1
    """n of the n-step return (1: the paper's one-step target)."""
    gamma: float = 0.99
    """Discount per agent step."""
    batch_size: int = 100
    """Transitions per learner update."""
    actor_lr: float = 1e-3
    """Adam learning rate of the actor."""
    critic_lr: float = 1e-3
    """Adam learning rate of the twin critics (one optimiser over both)."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    actor_hidden: tuple[int, ...] = (400, 300)
    """Actor: obs -> 400 -> ReLU -> 300 -> ReLU -> action_dim -> tanh."""
    critic_hidden: tuple[int, ...] = (400, 300)
    """Each critic: [obs, action] -> 400 -> ReLU -> 300 -> ReLU -> 1."""
    tau: float = 0.005
    """Polyak rate of the target networks: target <- (1 - tau) target + tau online, at every actor update."""
    policy_delay: int = 2
    """The actor and the targets are updated at every ``policy_delay``-th learner update (the critics at
    every one)."""
    target_noise: float = 0.2
    """Std of the target policy smoothing noise added to the target actor's action."""
    target_noise_clip: float = 0.5
    """The smoothing noise is clipped to [-c, c] before it is added (then the action to [-1, 1])."""
    noise_sigma: float = 0.1
    """Std of the Gaussian exploration noise of every actor (none in evaluation)."""
    priority_eps: float = 1e-6
    """Added to every new priority (the mean over the two critics of |TD error|) so that it is > 0."""
    obs_norm: bool = False
    """Normalise observations by the learner's running mean and variance (apexrl.agents.normalize)."""

    def __post_init__(self) -> None:
        _check_bool(self, "obs_norm")
        _check_positive_ints(self, "n_step", "batch_size", "policy_delay")
        _check_unit(self, "gamma", "tau")
        _check_positive_floats(self, "actor_lr", "critic_lr", "adam_eps", "priority_eps", "target_noise_clip")
        _check_nonneg_floats(self, "target_noise", "noise_sigma")
        _check_layers(self, "actor_hidden", "critic_hidden")
        if self.tau == 0:
            raise ValueError("TD3Config.tau must be > 0 (the targets would never move)")


@dataclass(frozen=True)
class SACConfig:
    """SAC (Haarnoja et al. 2018, Soft Actor-Critic Algorithms and Applications): squashed Gaussian policy,
    twin critics with Polyak targets, a learned temperature with target entropy -|A|; that paper's settings
    (its Table 1)."""

    n_step: int = 1
    """n of the n-step return (1: the paper's one-step soft target)."""
    gamma: float = 0.99
    """Discount per agent step."""
    batch_size: int = 256
    """Transitions per learner update."""
    actor_lr: float = 3e-4
    """Adam learning rate of the policy."""
    critic_lr: float = 3e-4
    """Adam learning rate of the twin critics (one optimiser over both)."""
    alpha_lr: float = 3e-4
    """Adam learning rate of log(alpha), the temperature."""
    adam_eps: float = 1e-8
    """Adam epsilon, every optimiser."""
    actor_hidden: tuple[int, ...] = (256, 256)
    """Policy: obs -> 256 -> ReLU -> 256 -> ReLU -> (mean, log std), 2 x action_dim."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Each critic: [obs, action] -> 256 -> ReLU -> 256 -> ReLU -> 1."""
    tau: float = 0.005
    """Polyak rate of the target critics, at every update."""
    init_alpha: float = 1.0
    """The temperature alpha at the start (log alpha = 0)."""
    target_entropy: float | None = None
    """Entropy the temperature steers the policy towards; None: -action_dim (the paper's -|A|)."""
    log_std_min: float = -20.0
    """The policy's log std is clamped to [log_std_min, log_std_max]."""
    log_std_max: float = 2.0
    """Upper clamp of the policy's log std."""
    priority_eps: float = 1e-6
    """Added to every new priority (the mean over the two critics of |soft TD error|) so that it is > 0."""
    obs_norm: bool = False
    """Normalise observations by the learner's running mean and variance (apexrl.agents.normalize)."""

    def __post_init__(self) -> None:
        _check_bool(self, "obs_norm")
        _check_positive_ints(self, "n_step", "batch_size")
        _check_unit(self, "gamma", "tau")
        _check_positive_floats(self, "actor_lr", "critic_lr", "alpha_lr", "adam_eps", "priority_eps", "init_alpha")
        _check_layers(self, "actor_hidden", "critic_hidden")
        if self.tau == 0:
            raise ValueError("SACConfig.tau must be > 0 (the targets would never move)")
        for name in ("log_std_min", "log_std_max", "target_entropy"):
            v = getattr(self, name)
            if v is None and name == "target_entropy":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"SACConfig.{name} must be a finite number, got {v!r}")
        if not self.log_std_min < self.log_std_max:
            raise ValueError(f"SACConfig needs log_std_min < log_std_max, got {self.log_std_min} >= {self.log_std_max}")


_AC_SOURCES = dict(
    n_step="Ape-X",
    gamma="Ape-X",
    batch_size="Ape-X",
    actor_lr="Ape-X",
    critic_lr="Ape-X",
    adam_eps="apexrl",
    critic_hidden="Ape-X",
    actor_hidden="Ape-X",
    target_update_period="Ape-X",
    priority_eps="apexrl",
    dqda_clip="Ape-X",
    dqda_clip_norm="Ape-X",
    actor_grad_clip="Ape-X",
    grad_clip_norm="Ape-X",
    actor_loss_state="Ape-X",
    actor_weights="Ape-X",
    obs_norm="apexrl",
)
FIELD_SOURCES: dict[type, Mapping[str, str]] = {
    DQNConfig: dict(
        n_step="Ape-X",
        gamma="Ape-X",
        batch_size="Ape-X",
        lr="Ape-X",
        rms_decay="Ape-X",
        rms_eps="Ape-X",
        rms_centered="Ape-X",
        optimizer="apexrl",
        grad_clip_norm="Ape-X",
        target_update_period="Ape-X",
        priority_eps="apexrl",
        huber_delta="Ape-X",
        hidden="apexrl",
        atari_stream_hidden="Dueling",
        epsilon_base="Ape-X",
        epsilon_alpha="Ape-X",
        eval_epsilon="Ape-X",
    ),
    DPGConfig: dict(_AC_SOURCES, noise_sigma="apexrl"),
    D4PGConfig: dict(
        _AC_SOURCES,
        n_step="D4PG",
        batch_size="D4PG",
        actor_lr="D4PG",
        critic_lr="D4PG",
        num_atoms="Acme",
        v_min="Acme",
        v_max="Acme",
        noise_sigma_max="Acme",
        noise_sigma_min="Acme",
        noise_sigma_spacing="apexrl",
    ),
    TD3Config: dict(
        dict.fromkeys(
            (
                "n_step",
                "gamma",
                "batch_size",
                "actor_lr",
                "critic_lr",
                "actor_hidden",
                "critic_hidden",
                "tau",
                "policy_delay",
                "target_noise",
                "target_noise_clip",
                "noise_sigma",
            ),
            "TD3",
        ),
        adam_eps="apexrl",
        priority_eps="apexrl",
        obs_norm="apexrl",
    ),
    SACConfig: dict(
        dict.fromkeys(
            (
                "n_step",
                "gamma",
                "batch_size",
                "actor_lr",
                "critic_lr",
                "alpha_lr",
                "actor_hidden",
                "critic_hidden",
                "tau",
                "target_entropy",
            ),
            "SAC",
        ),
        adam_eps="apexrl",
        init_alpha="apexrl",
        log_std_min="apexrl",
        log_std_max="apexrl",
        priority_eps="apexrl",
        obs_norm="apexrl",
    ),
}
"""Where each config class's default values come from (keys of ``apexrl.launch.preset_table.SOURCES``): the
Ape-X agents' written here, every other agent's set when it registers (``AgentDef.field_sources``); the
presets say where the values they set come from, and the generated presets table (docs/running.md) prints
both."""


__all__ = [
    "ACTOR_LOSS_STATES",
    "ACTOR_WEIGHTS",
    "D4PGConfig",
    "DPGConfig",
    "DQNConfig",
    "FIELD_SOURCES",
    "SACConfig",
    "SIGMA_SPACINGS",
    "TD3Config",
]
