"""The replay server: a thin Python side (socket, snapshots, HELLO/STATS) around the native serving loop.

``ReplayServer`` (:mod:`.replay_server`) configures the socket and hands it to ``apexrl._core.ServeLoop``;
:mod:`.control` serves HELLO, STATS and CHECKPOINT; :mod:`.epoch` keeps the key epochs of the server's lives; :mod:`.native`
finds the libzmq the loop binds. The client side of the replay service is ``apexrl.replay.client`` and
``apexrl.replay.client.sharded``.
"""

from __future__ import annotations

from apexrl.replay.server.config import ServerConfig, check_snapshot_dir
from apexrl.replay.server.epoch import SnapshotLoadError, SnapshotSaveError
from apexrl.replay.server.native import NativeLoopError
from apexrl.replay.server.replay_server import RCVHWM, ReplayServer, role_masks

__all__ = [
    "RCVHWM",
    "NativeLoopError",
    "ReplayServer",
    "ServerConfig",
    "SnapshotLoadError",
    "SnapshotSaveError",
    "check_snapshot_dir",
    "role_masks",
]
