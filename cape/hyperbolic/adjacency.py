"""Validation of a weighted gene adjacency before it is embedded: square, finite, no self-loops, acyclic."""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import numpy as np
import scipy.sparse as sp

from .._errors import CapeInputError


def as_sparse_adjacency(adjacency, *, what: str = "adjacency") -> sp.csr_matrix:
    """Return ``adjacency`` (dense array, sparse matrix or DataFrame) as a float64 CSR matrix.

    ``A[i, j] != 0`` means an edge i → j with strength ``|A[i, j]|``. Explicit zeros are dropped.

    Raises
    ------
    CapeInputError
        If the matrix is not 2-D square or has non-finite entries.
    """
    if hasattr(adjacency, "to_numpy") and not sp.issparse(adjacency):
        adjacency = adjacency.to_numpy()
    if sp.issparse(adjacency):
        matrix = sp.csr_matrix(adjacency, dtype=np.float64)
    else:
        array = np.asarray(adjacency, dtype=np.float64)
        if array.ndim != 2:
            raise CapeInputError(f"{what} must be a 2-D matrix, got an array with shape {array.shape}")
        matrix = sp.csr_matrix(array)
    if matrix.shape[0] != matrix.shape[1]:
        raise CapeInputError(f"{what} must be square (genes × genes), got shape {matrix.shape}")
    if not np.all(np.isfinite(matrix.data)):
        raise CapeInputError(f"{what} has non-finite (NaN or inf) entries")
    matrix.eliminate_zeros()
    matrix.sort_indices()
    return matrix


def to_digraph(adjacency: sp.csr_matrix) -> nx.DiGraph:
    """Weighted :class:`networkx.DiGraph` with weight ``|A[i, j]|`` on edge i → j (nodes 0..M-1)."""
    coo = adjacency.tocoo()
    graph = nx.DiGraph()
    graph.add_nodes_from(range(adjacency.shape[0]))
    graph.add_weighted_edges_from(zip(coo.row.tolist(), coo.col.tolist(), np.abs(coo.data).tolist(), strict=True))
    return graph


def check_dag(adjacency: sp.csr_matrix, names: Sequence[str] | None = None, *,
              what: str = "adjacency") -> None:
    """Reject self-loops and directed cycles, naming the genes involved.

    Raises
    ------
    CapeInputError
        ``"... has a self-loop on gene X"`` or ``"... has a directed cycle: a -> b -> a"``.
    """
    label = (lambda i: str(names[i])) if names is not None else str
    diagonal = adjacency.diagonal()
    loops = np.flatnonzero(diagonal)
    if loops.size:
        shown = ", ".join(label(int(i)) for i in loops[:5])
        more = f" (and {loops.size - 5} more)" if loops.size > 5 else ""
        raise CapeInputError(f"{what} has a self-loop on gene {shown}{more}; a causal graph must be a DAG")
    graph = to_digraph(adjacency)
    try:
        cycle = nx.find_cycle(graph, orientation="original")
    except nx.NetworkXNoCycle:
        return
    path = [label(u) for u, _v, _o in cycle] + [label(cycle[0][0])]
    raise CapeInputError(f"{what} has a directed cycle: {' -> '.join(path)}; a causal graph must be a DAG")
