"""The in-memory format of a batch of R2D2 sequences: what the learner trains on and what a sequence adder makes.

A batch is a mapping of numpy arrays (as the transition batches of the other agents), ``B`` sequences of ``L``
steps each, step ``t`` of a sequence being one agent step of one episode:

=========  ==================  ===========================================================================
field      shape, dtype        meaning
=========  ==================  ===========================================================================
obs        (B, L, *obs_shape)  the observation at step t, the one ``action[t]`` was chosen on; uint8 frames
           obs dtype           or float32 vectors, as the environment's spec. The last observation of an
                               episode (terminal or truncated) is a step of its own.
action     (B, L) int32        the action taken on ``obs[t]``; any value in [0, num_actions) where it was not
                               taken (the last observation of an episode, padding).
reward     (B, L) float32      the reward that followed ``action[t]`` (0 where no action was taken).
discount   (B, L) float32      0 when ``action[t]`` ended the episode in a terminal state (``obs[t + 1]`` is
                               terminal: no bootstrap from it), else 1. gamma is NOT in it (the learner
                               multiplies); a time-limit truncation keeps 1: the target bootstraps from the
                               episode's last observation.
mask       (B, L) bool         True where ``obs[t]`` is a real observation of the item's episode: True on a
                               prefix of the sequence, False from the first padding step or the first step
                               of another episode on. A sequence that reaches an episode's end has True up to
                               and including the episode's last observation.
state_h    (B, H) float32      the LSTM state (h, c) the actor's network held when it acted on ``obs[0]``: the
state_c    (B, H) float32      state it fed, with ``obs[0]``, into its step (zeros at an episode's first step).
=========  ==================  ===========================================================================

``H`` is ``R2D2Config.lstm_size``. ``L`` is at least ``burn_in + trace_length + 1`` (``R2D2Config.
min_sequence_length``): the first ``burn_in`` steps only unroll the LSTM from the stored state, steps
``burn_in .. burn_in + trace_length - 1`` are trained, and the n-step targets look ahead inside the sequence
as far as it goes (up to ``n_step`` steps; with ``L = burn_in + trace_length + 1``, the paper's "+1" layout,
the last ``n_step - 1`` trained steps get shorter returns that bootstrap from the sequence's last observation;
with ``L = burn_in + trace_length + n_step`` every trained step gets the full n).

What the learner reads into validity: step t is trained when it lies in the trained window, ``mask`` holds at t
and at t + 1, and no step before t ended the episode (``discount`` 0 at some step < t); whatever follows an
episode's end changes nothing (tests/agents/test_r2d2.py holds that), so a writer that pads with zeros or with
the next episode's steps makes the same loss, as long as ``mask`` is False there.

:func:`sequence_spec` is the batch as a :class:`~apexrl.replay.wire.codec.TransitionSpec` (one item per
sequence, one field per row above, lz4 on frames): a sequence adder can insert items with it and the learner
decode them with it, the recurrent state bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from apexrl.agents.r2d2.config import R2D2Config
from apexrl.replay.wire.codec import FieldSpec, TransitionSpec

__all__ = ["SEQUENCE_FIELDS", "check_sequences", "empty_sequences", "sequence_spec"]

SEQUENCE_FIELDS = ("obs", "action", "reward", "discount", "mask", "state_h", "state_c")
"""The fields of a sequence batch, in spec order."""


def _is_image(obs_shape: tuple[int, ...], obs_dtype: np.dtype) -> bool:
    return len(obs_shape) == 3 and np.dtype(obs_dtype) == np.uint8


def sequence_spec(obs_shape: tuple[int, ...], obs_dtype: np.dtype | str, length: int, lstm_size: int) -> TransitionSpec:
    """The codec of sequences of ``length`` steps of ``obs_shape``/``obs_dtype`` observations with an LSTM state of
    ``lstm_size``: one replay item per sequence (module docstring), frames lz4-compressed."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ValueError(f"a sequence holds at least 2 steps, got length={length!r}")
    dtype = np.dtype(obs_dtype)
    image = _is_image(tuple(obs_shape), dtype)
    return TransitionSpec(
        [
            FieldSpec("obs", dtype, (length, *obs_shape), compress=image),
            FieldSpec("action", "i4", (length,)),
            FieldSpec("reward", "f4", (length,)),
            FieldSpec("discount", "f4", (length,)),
            FieldSpec("mask", "b1", (length,)),
            FieldSpec("state_h", "f4", (lstm_size,)),
            FieldSpec("state_c", "f4", (lstm_size,)),
        ]
    )


def empty_sequences(
    batch: int, length: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype | str, lstm_size: int
) -> dict[str, np.ndarray]:
    """A batch of ``batch`` all-padding sequences (zeros, mask False, discount 1) for a writer to fill."""
    return {
        "obs": np.zeros((batch, length, *obs_shape), np.dtype(obs_dtype)),
        "action": np.zeros((batch, length), np.int32),
        "reward": np.zeros((batch, length), np.float32),
        "discount": np.ones((batch, length), np.float32),
        "mask": np.zeros((batch, length), bool),
        "state_h": np.zeros((batch, lstm_size), np.float32),
        "state_c": np.zeros((batch, lstm_size), np.float32),
    }


def check_sequences(
    batch: Mapping[str, np.ndarray],
    config: R2D2Config,
    obs_shape: tuple[int, ...],
    weights: np.ndarray | None = None,
) -> tuple[int, int]:
    """``(B, L)`` of a sequence batch; ValueError naming the first field that is missing or has the wrong shape,
    when ``L < config.min_sequence_length``, or when an IS weight is missing or not finite."""
    missing = [k for k in SEQUENCE_FIELDS if k not in batch]
    if missing:
        raise ValueError(f"sequence batch is missing field(s) {missing}; expected {list(SEQUENCE_FIELDS)}")
    obs = np.asarray(batch["obs"])
    if obs.ndim != 2 + len(obs_shape) or tuple(obs.shape[2:]) != tuple(obs_shape):
        raise ValueError(f"obs has shape {obs.shape}, expected (B, L, {', '.join(map(str, obs_shape))})")
    b, length = obs.shape[:2]
    if b == 0:
        raise ValueError("empty batch")
    for k in ("action", "reward", "discount", "mask"):
        if np.shape(batch[k]) != (b, length):
            raise ValueError(f"{k} has shape {np.shape(batch[k])}, expected {(b, length)}")
    for k in ("state_h", "state_c"):
        if np.shape(batch[k]) != (b, config.lstm_size):
            raise ValueError(f"{k} has shape {np.shape(batch[k])}, expected {(b, config.lstm_size)}")
    if length < config.min_sequence_length:
        raise ValueError(
            f"sequences of {length} steps; burn-in {config.burn_in} + trace {config.trace_length} + 1 needs "
            f"at least {config.min_sequence_length}"
        )
    if weights is not None:
        if np.shape(weights) != (b,):
            raise ValueError(f"{np.shape(weights)} IS weights for {b} sequences")
        if not np.all(np.isfinite(weights)):
            raise ValueError("IS weights must be finite")
    return b, length
