"""The parameter service: the learner serves its policy weights (safetensors bytes) to the actors."""

from __future__ import annotations

from apexrl.params.service import (
    ParamClient,
    ParamPoller,
    ParamServer,
    deserialize_tensors,
    serialize_tensors,
)

__all__ = ["ParamClient", "ParamPoller", "ParamServer", "deserialize_tensors", "serialize_tensors"]
