"""``python -m apexrl``: the same as the ``apexrl`` command (run, plot)."""

import sys

from apexrl.cli.main import main

sys.exit(main())
