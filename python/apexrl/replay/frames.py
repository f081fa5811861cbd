"""The old path of :mod:`apexrl.replay.wire.frames` (moved in issue 35): importing it gives that module."""

import sys

from apexrl.replay.wire import frames as _module

sys.modules[__name__] = _module
