"""Learner checkpoints: named raw tensors in a safetensors file, written atomically.

A checkpoint is ``dict[str, torch.Tensor]`` (networks, target networks, optimiser state and counters, as
flattened by the agent's ``state_dict()``) plus a small string-to-string ``metadata`` map (learner counters,
the agent and env names, the config). safetensors stores a JSON header and raw bytes, so loading a
checkpoint never unpickles anything.

Writes go to ``<path>.tmp.<pid>`` which is fsynced and renamed over ``path``: a learner killed mid-save leaves
the previous checkpoint intact (and a stale temporary that the next save removes); a save that fails (disk
full) removes its temporary and raises OSError, ``path`` untouched.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as _serialize

from apexrl.durable import remove_stale_temporaries, write_atomically

__all__ = ["CheckpointError", "load_checkpoint", "save_checkpoint"]

_META_KEY = "apexrl"


class CheckpointError(ValueError):
    """The checkpoint file is missing, truncated, not a safetensors file, or not an apexrl checkpoint."""


def save_checkpoint(path: str, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> None:
    """Atomically write ``tensors`` and the JSON-serialisable ``meta`` to ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    remove_stale_temporaries(path)  # left by a writer killed mid-save
    # safetensors refuses shared or non-contiguous storage: give it plain CPU copies.
    plain = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    write_atomically(path, _serialize(plain, metadata={_META_KEY: json.dumps(dict(meta), sort_keys=True)}))


def load_checkpoint(path: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(tensors, meta)`` from a file written by :func:`save_checkpoint`; CheckpointError if it is not one."""
    if not os.path.exists(path):
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            raw_meta = (f.metadata() or {}).get(_META_KEY)
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open is no dict: keys() is its API
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not a readable checkpoint: {e}") from e
    if raw_meta is None:
        raise CheckpointError(f"{path} is a safetensors file but not an apexrl checkpoint (no '{_META_KEY}' metadata)")
    try:
        meta = json.loads(raw_meta)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: corrupt metadata ({e})") from e
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: metadata is not a JSON object")
    return tensors, meta
