"""The Ape-X actors' n-step names, kept where they always were.

The n-step core itself (:class:`NStepBuffer`, :class:`VecNStep`, :class:`Transition`, and the formulas, the
terminated-vs-truncated rules and the timing in its docstring) lives in :mod:`apexrl.replay.adders.transition`,
the one n-step implementation of the package, under :class:`~apexrl.replay.adders.NStepTransitionAdder` and
:class:`~apexrl.replay.adders.VecNStepTransitionAdder`, through which the actors insert; the names here are
re-exports of it. What stays here is :func:`stack_transitions`: a list of Transitions stacked into a
:class:`~apexrl.replay.wire.codec.TransitionSpec` batch (what tests and the offline tools build batches with).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from apexrl.replay.adders.transition import NStepBuffer, Transition, VecNStep
from apexrl.replay.wire.codec import TransitionSpec

__all__ = ["NStepBuffer", "Transition", "VecNStep", "stack_transitions"]


def stack_transitions(ts: Sequence[Transition], spec: TransitionSpec) -> dict[str, np.ndarray]:
    """Stack transitions into the batch ``spec.encode`` takes: one array per field of ``spec`` (by name, taken
    from the :class:`Transition` field of that name), leading dim ``len(ts)``, exactly the spec's
    (native-endian) dtype and item shape.

    Raises:
      ValueError: the spec names a field the n-step adder does not produce, or a transition's value has the
        wrong shape (or does not convert to the spec's dtype).
    """
    unknown = [name for name in spec.names if name not in Transition._fields]
    if unknown:
        raise ValueError(f"spec fields {unknown} are not n-step transition fields {list(Transition._fields)}")
    out: dict[str, np.ndarray] = {}
    for f in spec.fields:
        arr = np.empty((len(ts), *f.shape), dtype=f.dtype.newbyteorder("="))
        for j, t in enumerate(ts):
            value = np.asarray(getattr(t, f.name))
            if value.shape != f.shape:
                raise ValueError(f"transition {j}: field {f.name!r} has shape {value.shape}, expected {f.shape}")
            arr[j] = value
        out[f.name] = arr
    return out
