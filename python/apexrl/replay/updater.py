"""The old path of :mod:`apexrl.replay.client.updater` (moved in issue 35): importing it gives that module."""

import sys

from apexrl.replay.client import updater as _module

sys.modules[__name__] = _module
