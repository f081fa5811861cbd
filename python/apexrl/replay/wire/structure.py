"""Structured items: a (nested) mapping of arrays with a leading batch dimension <-> a :class:`TransitionSpec`.

This is the TransitionSpec path, reached from a mapping: nested keys flatten to field names joined by ``"."``
(``{"obs": {"pixels": a}}`` is the field ``obs.pixels``), a table's spec is inferred from its first batch
(each field's dtype and ``shape[1:]``, fields in sorted name order, nothing compressed unless named in
``compress``), and sampled items decode back into the same nesting. Arrays may be numpy arrays, anything with
``__array__`` or ``__dlpack__``, or torch tensors (duck-typed through ``.detach().cpu().numpy()``: this module
never imports torch).

Imports no torch; every function is pure (thread-safe).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from apexrl.replay.wire.codec import FieldSpec, TransitionSpec

__all__ = ["SEPARATOR", "as_array", "flatten", "infer_spec", "structure_mismatch", "unflatten"]

SEPARATOR = "."
"""Joins a nested mapping's keys into a field name (a character the spec's name rule allows only there)."""


def as_array(value: Any, name: str) -> np.ndarray:
    """``value`` as a numpy array without importing torch: a torch tensor through ``.detach().cpu().numpy()``
    (a tensor on a GPU is copied to the host), else ``np.asarray`` (``__array__``, sequences) or
    ``np.from_dlpack``; ValueError naming the field for anything that is not a numeric or bool array."""
    if isinstance(value, np.ndarray):
        arr = value
    elif all(callable(getattr(value, a, None)) for a in ("detach", "cpu", "numpy")):
        arr = value.detach().cpu().numpy()
    elif hasattr(value, "__array__") or not hasattr(value, "__dlpack__"):
        arr = np.asarray(value)
    else:
        arr = np.from_dlpack(value)
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biufc":
        what = arr.dtype if isinstance(arr, np.ndarray) else type(arr).__name__
        raise ValueError(f"field {name!r}: expected a numeric or bool array, got {what}")
    return arr


def flatten(items: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``{field name: array}`` of a nested mapping (keys joined by SEPARATOR, in the mapping's order); ValueError
    naming the path of a key that is not an identifier, of an empty mapping or of a value that is no array."""
    out: dict[str, np.ndarray] = {}

    def walk(node: Mapping[Any, Any], prefix: str) -> None:
        if not node:
            raise ValueError(f"items{'' if not prefix else ' ' + repr(prefix)}: an empty mapping holds no field")
        for key, value in node.items():
            if not isinstance(key, str) or not key.isidentifier() or not key.isascii():
                raise ValueError(
                    f"items: key {key!r}{' under ' + repr(prefix) if prefix else ''} is not an ASCII identifier "
                    "(nested keys are joined by '.' into field names)"
                )
            name = f"{prefix}{SEPARATOR}{key}" if prefix else key
            if isinstance(value, Mapping):
                walk(value, name)
            else:
                out[name] = as_array(value, name)

    if not isinstance(items, Mapping):
        raise ValueError(f"items must be a mapping of arrays, got {type(items).__name__}")
    walk(items, "")
    return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The nested mapping whose :func:`flatten` is ``flat`` (a field ``a.b`` becomes ``out["a"]["b"]``)."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        *path, leaf = name.split(SEPARATOR)
        node = out
        for key in path:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def _leading(flat: Mapping[str, np.ndarray]) -> int:
    n: int | None = None
    first = ""
    for name, arr in flat.items():
        if arr.ndim == 0:
            raise ValueError(f"field {name!r}: expected an array with a leading batch dimension, got a scalar")
        if n is None:
            n, first = int(arr.shape[0]), name
        elif arr.shape[0] != n:
            raise ValueError(f"field {name!r}: leading (batch) dimension {arr.shape[0]}, but field {first!r} has {n}")
    assert n is not None  # flatten refuses an empty mapping
    return n


def infer_spec(flat: Mapping[str, np.ndarray], compress: Iterable[str] = ()) -> TransitionSpec:
    """The spec of a flattened batch: one field per name, in sorted order (so the same structure gives the same
    spec, whatever the order of its keys), of the array's dtype and ``shape[1:]``; the names in ``compress`` go
    through lz4. ValueError for a batch without a common leading dimension or a name of ``compress`` it lacks."""
    _leading(flat)
    compressed = set(compress)
    unknown = sorted(compressed - set(flat))
    if unknown:
        raise ValueError(f"compress names field(s) {unknown} the batch does not have; it has {sorted(flat)}")
    return TransitionSpec(
        [FieldSpec(name, flat[name].dtype, flat[name].shape[1:], name in compressed) for name in sorted(flat)]
    )


def structure_mismatch(spec: TransitionSpec, flat: Mapping[str, np.ndarray]) -> str | None:
    """Why a flattened batch does not fit ``spec`` (the first difference, naming the field), or None when it
    does: a missing or extra field, a dtype that does not cast safely to the field's, another per-item shape,
    or leading dimensions that differ."""
    names = set(spec.names)
    missing = [name for name in spec.names if name not in flat]
    if missing:
        return f"missing field(s) {missing} (the table's structure has {list(spec.names)})"
    extra = sorted(name for name in flat if name not in names)
    if extra:
        return f"extra field(s) {extra} (the table's structure has {list(spec.names)})"
    for f in spec.fields:
        arr = flat[f.name]
        if arr.ndim == 0:
            return f"field {f.name!r}: expected shape (n, *{f.shape}), got a scalar"
        if not np.can_cast(arr.dtype, f.dtype, casting="safe"):
            return f"field {f.name!r}: dtype {arr.dtype}, the table's structure has {f.dtype.newbyteorder('=')}"
        if arr.shape[1:] != f.shape:
            return f"field {f.name!r}: per-item shape {arr.shape[1:]}, the table's structure has {f.shape}"
    try:
        _leading(flat)
    except ValueError as exc:
        return str(exc)
    return None
