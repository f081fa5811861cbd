"""The replay service: wire protocol, transition codec, the ZeroMQ replay server and its clients.

Never imports torch (a test checks it): a replay server, or a tool that only talks to one, starts in a
fraction of a second and runs where torch is not installed.
"""

from __future__ import annotations

from apexrl.replay.client import ReplayClient, SampledBatch
from apexrl.replay.codec import FieldSpec, TransitionSpec
from apexrl.replay.server import ReplayServer, ServerConfig

__all__ = ["FieldSpec", "ReplayClient", "ReplayServer", "SampledBatch", "ServerConfig", "TransitionSpec"]
