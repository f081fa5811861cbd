"""Running a whole Ape-X system: presets, the typed run plan, the local process launcher and its progress."""
