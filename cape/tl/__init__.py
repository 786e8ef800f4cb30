"""Tools: AnnData in, results written to standard slots (see the data contract in the README)."""

from __future__ import annotations

from .causal_graph import causal_graph  # noqa: F401  (Step I; torch imported on call)
from .hyperbolic import cape, hyperbolic_embedding, rotary_encoding  # noqa: F401  (Steps II-III)
from .tasks import annotate, cluster, predict_perturbation  # noqa: F401  (downstream tasks)
