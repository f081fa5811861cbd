"""The old path of :mod:`apexrl.replay.server.insert_guard` (moved in issue 35): importing it gives that module."""

import sys

from apexrl.replay.server import insert_guard as _module

sys.modules[__name__] = _module
