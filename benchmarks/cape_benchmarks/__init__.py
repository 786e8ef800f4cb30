"""The paper's experiments: runners that write ``results/bench/<name>.json`` (records), ``.md`` and ``.png``.

The tasks, metrics and baselines they run live in :mod:`cape.tasks`; only :mod:`cape.cli` imports this package."""

from __future__ import annotations

