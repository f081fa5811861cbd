"""No orphaned children: what a launcher or a Ray process host runs in each child before exec."""

from __future__ import annotations

import ctypes
import signal
import sys

__all__ = ["die_with_parent"]


def die_with_parent() -> None:
    """In the child before exec (``preexec_fn``): ask Linux for SIGTERM when the parent dies (no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
