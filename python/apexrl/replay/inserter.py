"""The old path of :mod:`apexrl.replay.client.inserter` (moved in issue 35): importing it gives that module."""

import sys

from apexrl.replay.client import inserter as _module

sys.modules[__name__] = _module
