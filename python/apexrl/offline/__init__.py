"""Offline data: record the episodes actors play as Minari datasets (:mod:`apexrl.offline.record`), train a
learner from a Minari dataset with no actors (:mod:`apexrl.offline.loader`, ``apexrl run --offline``), and export
a replay snapshot to ``.npz`` (:mod:`apexrl.offline.export`, ``apexrl export``). docs/offline.md describes the
layouts. Minari is an optional extra (``pip install 'apexrl[offline]'``); only recording and loading need it."""

from __future__ import annotations

__all__ = ["MINARI_EXTRA", "require_minari"]

MINARI_EXTRA = "offline"
"""The extra that installs Minari (with h5py): ``pip install 'apexrl[offline]'``."""


def require_minari():
    """The ``minari`` module; ImportError naming the extra when it (or its HDF5 backend) is missing."""
    try:
        import h5py  # noqa: F401  (Minari's hdf5 data format, the one apexrl writes)
        import minari
    except ImportError as e:
        raise ImportError(
            f"Minari datasets need the {MINARI_EXTRA!r} extra: pip install 'apexrl[{MINARI_EXTRA}]' ({e})"
        ) from None
    return minari
