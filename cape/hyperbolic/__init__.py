"""Step II: embed the weighted gene DAG in hyperbolic space (paper Sec. 3.4, Supp. A.2).

- :func:`khop_positives` — k-hop positive pairs with strongest-path-product weights.
- :func:`pagerank_generality` — causal generality π (Eq. 18).
- :mod:`cape.hyperbolic.loss` — contrastive loss (Eq. 16) and regulariser (Eq. 17), exact and sampled.
- :func:`embed_dag` — Lorentz embedding by Riemannian SGD (geoopt), float64.
- :func:`lorentz_to_poincare` / :func:`poincare_to_lorentz` — Eqs. A.22 / A.23.
"""

from __future__ import annotations

from .adjacency import as_sparse_adjacency, check_dag
from .embedding import EmbeddingResult, embed_dag
from .embedding_config import EmbeddingConfig
from .generality import pagerank_generality
from .geometry import EuclideanGeometry, LorentzGeometry
from .poincare import (
    hyperboloid_residual,
    lorentz_distance,
    lorentz_to_poincare,
    minkowski_inner,
    pairwise_poincare_distance,
    poincare_distance,
    poincare_to_lorentz,
)
from .positives import PositivePairs, khop_positives, strongest_path_products

__all__ = [
    "EmbeddingConfig",
    "EmbeddingResult",
    "EuclideanGeometry",
    "LorentzGeometry",
    "PositivePairs",
    "as_sparse_adjacency",
    "check_dag",
    "embed_dag",
    "hyperboloid_residual",
    "khop_positives",
    "lorentz_distance",
    "lorentz_to_poincare",
    "minkowski_inner",
    "pagerank_generality",
    "pairwise_poincare_distance",
    "poincare_distance",
    "poincare_to_lorentz",
    "strongest_path_products",
]
