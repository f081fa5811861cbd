"""The old path of :mod:`apexrl.replay.client.dataset` (moved in issue 35): importing it gives that module."""

import sys

from apexrl.replay.client import dataset as _module

sys.modules[__name__] = _module
