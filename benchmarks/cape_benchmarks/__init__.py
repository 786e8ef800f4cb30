"""cape's benchmarks, the paper's experiments: runners that write ``results/bench/<name>.json`` (records), ``.md``
and ``.png``, run by the ``cape-bench`` command line (:mod:`cape_benchmarks.cli`).

A project of its own beside the library: it depends on :mod:`cape` (the tasks, metrics and baselines it runs live in
:mod:`cape.tasks`), and :mod:`cape` never imports it (an import-linter contract in ``pyproject.toml``)."""

from __future__ import annotations

