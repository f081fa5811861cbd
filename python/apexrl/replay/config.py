"""The old path of :mod:`apexrl.replay.server.config` (moved in issue 35): importing it gives that module."""

import sys

from apexrl.replay.server import config as _module

sys.modules[__name__] = _module
