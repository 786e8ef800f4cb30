"""Tools: AnnData in, results written to standard slots (see the data contract in the README)."""

from __future__ import annotations

from .causal_graph import causal_graph  # noqa: F401  (Step I)
from .hyperbolic import hyperbolic_embedding  # noqa: F401  (Step II)
from .intervention import predict_intervention  # noqa: F401  (do() on Step I's equations)
from .pipeline import cape  # noqa: F401  (Steps I-III)
from .rotary import rotary_encoding  # noqa: F401  (Step III)
from .tasks import annotate, cluster, predict_perturbation  # noqa: F401  (downstream tasks)
