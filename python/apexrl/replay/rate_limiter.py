"""The old path of :mod:`apexrl.replay.server.rate_limiter` (moved in issue 35): importing it gives that module."""

import sys

from apexrl.replay.server import rate_limiter as _module

sys.modules[__name__] = _module
