"""Tools: AnnData in, results written to standard slots (see the data contract, docs/data_contract.md)."""

from __future__ import annotations

from ..causal.causal_config import CausalConfig  # Step I's options
from ..hyperbolic.embedding_config import EmbeddingConfig  # Step II's options
from ._causal_graph import causal_graph, intervention_mask  # Step I (and its per-cell interventions)
from ._hyperbolic_embedding import hyperbolic_embedding  # Step II
from ._pipeline import cape  # Steps I-III
from ._predict_intervention import predict_intervention  # do() on Step I's equations
from ._rotary_encoding import rotary_encoding  # Step III
from ._tasks import annotate, cluster, predict_perturbation  # downstream tasks

__all__ = [
    "CausalConfig",
    "EmbeddingConfig",
    "annotate",
    "cape",
    "causal_graph",
    "cluster",
    "hyperbolic_embedding",
    "intervention_mask",
    "predict_intervention",
    "predict_perturbation",
    "rotary_encoding",
]
