"""Tools: AnnData in, results written to standard slots (see the data contract, docs/data_contract.md)."""

from __future__ import annotations

from ..causal.config import CausalConfig  # Step I's options
from ..hyperbolic.config import EmbeddingConfig  # Step II's options
from .causal import causal_graph  # Step I
from .hyperbolic import hyperbolic_embedding  # Step II
from .intervention import predict_intervention  # do() on Step I's equations
from .pipeline import cape  # Steps I-III
from .rotary import rotary_encoding  # Step III
from .tasks import annotate, cluster, predict_perturbation  # downstream tasks

__all__ = [
    "CausalConfig",
    "EmbeddingConfig",
    "annotate",
    "cape",
    "causal_graph",
    "cluster",
    "hyperbolic_embedding",
    "predict_intervention",
    "predict_perturbation",
    "rotary_encoding",
]
