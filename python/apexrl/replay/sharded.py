"""The old path of :mod:`apexrl.replay.client.sharded` (moved in issue 35): importing it gives that module."""

import sys

from apexrl.replay.client import sharded as _module

sys.modules[__name__] = _module
