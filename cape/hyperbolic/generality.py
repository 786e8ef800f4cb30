"""Causal generality π (Eq. 18): PageRank on the reversed weighted DAG, so mass flows child → parent."""

from __future__ import annotations

import networkx as nx
import numpy as np
import scipy.sparse as sp

from .._errors import CapeInputError
from .adjacency import to_digraph


def pagerank_generality(adjacency: sp.spmatrix, restart: float = 0.15, *, tol: float = 1e-12,
                        max_iter: int = 10_000) -> np.ndarray:
    """PageRank generality π of every node (Eq. 18), summing to 1.

    The random walk starts anywhere, follows an incoming edge of the current node back to a parent with
    probability proportional to ``|A|`` (the in-degree-normalised transition ``Pᵀ = |A| D_in⁻¹``), and
    restarts uniformly with probability ``restart``. Roots (many descendants) collect the most mass; a node
    without parents (dangling in the reversed graph) restarts uniformly, as networkx does.

    Parameters
    ----------
    adjacency
        M×M weighted adjacency, ``A[i, j] != 0`` meaning i → j.
    restart
        Restart weight w ∈ (0, 1); networkx's damping ``alpha = 1 - w``.

    Returns
    -------
    numpy.ndarray
        π, shape (M,), float64, positive, sums to 1.
    """
    if not 0.0 < float(restart) < 1.0:
        raise CapeInputError(f"restart must be in (0, 1), got {restart!r}")
    n = adjacency.shape[0]
    if n == 0:
        return np.zeros(0)
    reversed_graph = to_digraph(sp.csr_matrix(adjacency)).reverse(copy=True)
    ranks = nx.pagerank(reversed_graph, alpha=1.0 - float(restart), weight="weight", tol=tol,
                        max_iter=max_iter)
    pi = np.array([ranks[i] for i in range(n)], dtype=np.float64)
    return pi / pi.sum()
