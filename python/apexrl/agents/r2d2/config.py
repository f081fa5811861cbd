"""R2D2's hyper-parameters (Kapturowski et al. 2019) and where each default comes from."""

from __future__ import annotations

import math
from dataclasses import dataclass

from apexrl.agents.config import _check_layers, _check_positive_floats, _check_positive_ints, _check_unit

__all__ = ["R2D2Config", "R2D2_FIELD_SOURCES"]


@dataclass(frozen=True)
class R2D2Config:
    """R2D2: a recurrent dueling double-Q network trained on replayed sequences with stored recurrent state,
    burn-in, n-step targets under invertible value rescaling, and sequence priorities (paper defaults)."""

    n_step: int = 5
    """n of the n-step targets, computed inside each sequence (apexrl.agents.r2d2.learner)."""
    gamma: float = 0.997
    """Discount per agent step."""
    batch_size: int = 64
    """Sequences per learner update."""
    burn_in: int = 40
    """Leading steps of each sequence that only unroll the LSTM (no gradient) from the stored state."""
    trace_length: int = 80
    """Steps after the burn-in that the loss trains on; a sequence holds at least burn_in + trace_length + 1
    steps (the last trained step needs its next observation)."""
    sequence_period: int = 40
    """Steps between the first steps of consecutive items of one episode (the adder's; the learner ignores it)."""
    lr: float = 1e-4
    """Adam learning rate."""
    lr_end: float | None = None
    """Learning rate at and after ``lr_decay_steps`` updates, reached linearly from ``lr`` (a schedule as IMPALA's
    and PPO's linear annealing, held at this floor instead of 0); None: ``lr`` throughout."""
    lr_decay_steps: int = 0
    """Learner updates over which the learning rate goes from ``lr`` to ``lr_end`` (needs ``lr_end``)."""
    adam_eps: float = 1e-3
    """Adam epsilon."""
    grad_clip_norm: float | None = None
    """Clip the global gradient norm to this; None: no clipping (the paper names none)."""
    target_update_period: int = 2500
    """Learner updates between hard copies of the online network into the target network."""
    priority_eta: float = 0.9
    """Sequence priority eta * max_t |delta_t| + (1 - eta) * mean_t |delta_t| over the valid trained steps."""
    priority_eps: float = 1e-6
    """Added to every priority so that it is > 0."""
    rescale_eps: float = 1e-3
    """epsilon of the value rescaling h(x) = sign(x) (sqrt(|x| + 1) - 1) + epsilon x."""
    lstm_size: int = 512
    """Units of the LSTM (its state h and c are each this long)."""
    hidden: tuple[int, ...] = (512,)
    """Hidden layers (ReLU) of the MLP torso for vector observations, before the LSTM."""
    stream_hidden: int = 512
    """Hidden units of each dueling stream on top of the LSTM (Wang et al. 2016)."""
    epsilon_base: float = 0.4
    """Exploration ladder: environment i of N uses epsilon_base ** (1 + epsilon_alpha * i / (N - 1))."""
    epsilon_alpha: float = 7.0
    """Exponent range of the exploration ladder (see epsilon_base)."""
    eval_epsilon: float = 0.001
    """Epsilon of evaluation episodes (``explore=False``)."""

    def __post_init__(self) -> None:
        _check_positive_ints(
            self, "n_step", "batch_size", "trace_length", "sequence_period", "target_update_period", "lstm_size"
        )
        _check_positive_ints(self, "stream_hidden")
        if isinstance(self.burn_in, bool) or not isinstance(self.burn_in, int) or self.burn_in < 0:
            raise ValueError(f"R2D2Config.burn_in must be an int >= 0, got {self.burn_in!r}")
        _check_unit(self, "gamma", "priority_eta", "epsilon_base", "eval_epsilon")
        _check_positive_floats(self, "lr", "adam_eps", "priority_eps", "rescale_eps", "epsilon_alpha")
        _check_positive_floats(self, "grad_clip_norm", "lr_end", allow_none=True)
        if isinstance(self.lr_decay_steps, bool) or not isinstance(self.lr_decay_steps, int) or self.lr_decay_steps < 0:
            raise ValueError(f"R2D2Config.lr_decay_steps must be an int >= 0, got {self.lr_decay_steps!r}")
        if (self.lr_end is None) != (self.lr_decay_steps == 0):
            raise ValueError(
                "R2D2Config.lr_end and lr_decay_steps go together (a linear schedule from lr to lr_end over "
                f"lr_decay_steps updates), got lr_end={self.lr_end!r}, lr_decay_steps={self.lr_decay_steps!r}"
            )
        _check_layers(self, "hidden")
        if not math.isfinite(self.gamma):
            raise ValueError(f"R2D2Config.gamma must be finite, got {self.gamma!r}")

    def lr_at(self, steps: int) -> float:
        """The learning rate of the update after ``steps`` updates (the linear schedule, or ``lr``)."""
        if self.lr_end is None:
            return self.lr
        frac = min(1.0, steps / self.lr_decay_steps)
        return self.lr + frac * (self.lr_end - self.lr)

    @property
    def min_sequence_length(self) -> int:
        """The fewest steps a sequence may hold: burn-in, the trained steps and the last one's next observation."""
        return self.burn_in + self.trace_length + 1


R2D2_FIELD_SOURCES: dict[str, str] = dict(
    n_step="R2D2",
    gamma="R2D2",
    batch_size="R2D2",
    burn_in="R2D2",
    trace_length="R2D2",
    sequence_period="R2D2",
    lr="R2D2",
    lr_end="apexrl",
    lr_decay_steps="apexrl",
    adam_eps="R2D2",
    grad_clip_norm="apexrl",
    target_update_period="R2D2",
    priority_eta="R2D2",
    priority_eps="apexrl",
    rescale_eps="R2D2",
    lstm_size="R2D2",
    hidden="apexrl",
    stream_hidden="Dueling",
    epsilon_base="Ape-X",
    epsilon_alpha="Ape-X",
    eval_epsilon="Ape-X",
)
"""Where each R2D2Config default comes from: keys of ``apexrl.launch.preset_table.SOURCES`` plus ``R2D2``
(:data:`apexrl.agents.r2d2.presets.R2D2_SOURCE`); the R2D2 ``AgentDef`` declares both (``field_sources``,
``sources``)."""
