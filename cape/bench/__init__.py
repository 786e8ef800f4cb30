"""Benchmarks and metrics. Runners write ``results/bench/<name>.json`` (records), ``.md`` and ``.png``."""

from __future__ import annotations

from .dag_metrics import dag_metrics  # noqa: F401  (SHD/TPR/FDR/F1 via gcastle MetricsDAG, AUPRC)
from .layer_relativity import layer_non_relativity  # noqa: F401  (per layer of a trained model; torch lazily)
from .non_relativity import non_relativity  # noqa: F401  (Behind-RoPE diagnostic; torch imported lazily)
