"""The old path of :mod:`apexrl.replay.wire.protocol` (moved in issue 35): importing it gives that module."""

import sys

from apexrl.replay.wire import protocol as _module

sys.modules[__name__] = _module
