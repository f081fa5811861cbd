"""The old path of :mod:`apexrl.replay.client.sampler` (moved in issue 35): importing it gives that module."""

import sys

from apexrl.replay.client import sampler as _module

sys.modules[__name__] = _module
