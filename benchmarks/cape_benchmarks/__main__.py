"""``python -m cape_benchmarks`` runs the ``cape-bench`` command line."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
