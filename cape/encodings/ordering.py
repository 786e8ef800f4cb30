"""Scalar gene orders for order-based encodings (rope, trainable_relative, hope, grape_a).

Genes have no sequence order; these helpers make one from the causal DAG (topological order, ties broken by
PageRank generality so that more general genes come first) or per cell from expression (rank 0 = highest, as
in Geneformer). Inputs are arrays, scipy sparse matrices or networkx graphs — never AnnData.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from .._errors import CapeInputError
from ..hyperbolic.generality import pagerank_generality


def _as_digraph(graph) -> nx.DiGraph:
    if isinstance(graph, nx.DiGraph):
        return graph
    if isinstance(graph, nx.Graph):
        raise CapeInputError("a gene order needs a directed graph (DAG), got an undirected networkx Graph")
    if sp.issparse(graph):
        adjacency = sp.csr_matrix(graph)
    else:
        adjacency = sp.csr_matrix(np.asarray(graph, dtype=float))
    if adjacency.shape[0] != adjacency.shape[1]:
        raise CapeInputError(f"the adjacency must be square, got shape {adjacency.shape}")
    g = nx.from_scipy_sparse_array(abs(adjacency), create_using=nx.DiGraph)
    g.remove_edges_from(nx.selfloop_edges(g))
    return g


def topological_positions(graph, generality: np.ndarray | None = None, used: np.ndarray | None = None,
                          normalise: bool = False) -> np.ndarray:
    """Rank of every node in a topological order of the DAG, ties broken by generality (higher first).

    Parameters
    ----------
    graph
        (M, M) adjacency (dense or sparse, A[i, j] ≠ 0 means i → j) or a networkx DiGraph on nodes 0..M−1.
    generality
        (M,) tie-break score (e.g. ``var["cape_generality"]``); PageRank generality when None.
    used
        (M,) bool: nodes that take part (``var["cape_used"]``); the others get NaN (no position).
    normalise
        Map ranks to [0, 1] (rank / (n_used − 1)).

    Returns
    -------
    (M,) float array of ranks 0, 1, … over the used nodes (NaN elsewhere).
    """
    g = _as_digraph(graph)
    m = g.number_of_nodes()
    if used is not None:
        used = np.asarray(used, dtype=bool)
        if used.shape != (m,):
            raise CapeInputError(f"'used' has {used.shape[0]} entries but the graph has {m} nodes")
        g = g.subgraph(np.flatnonzero(used).tolist()).copy()
    if not nx.is_directed_acyclic_graph(g):
        cycle = nx.find_cycle(g)
        path = " → ".join(str(u) for u, _ in cycle)
        raise CapeInputError(f"the gene graph has a cycle ({path}); need a DAG")
    if generality is None:  # Step II's causal generality π (Eq. 18), on the whole graph
        full = _as_digraph(graph)
        generality = pagerank_generality(nx.to_scipy_sparse_array(full, nodelist=sorted(full.nodes), weight="weight"))
    generality = np.asarray(generality, dtype=float)
    order = list(nx.lexicographical_topological_sort(g, key=lambda n: (-generality[n], n)))
    ranks = np.full(m, np.nan)
    ranks[order] = np.arange(len(order), dtype=float)
    if normalise and len(order) > 1:
        ranks /= len(order) - 1
    return ranks


def expression_rank_positions(values: Tensor, key_padding_mask: Tensor | None = None,
                              normalise: bool = False) -> Tensor:
    """Per-cell rank of each token by expression, descending (rank 0 = most expressed; ties by token index).

    ``values``: (B, L) expression; padded tokens (``key_padding_mask`` True) rank last.
    """
    if values.ndim != 2:
        raise CapeInputError(f"expression values must be (batch, length), got shape {tuple(values.shape)}")
    v = values.float()
    if key_padding_mask is not None:
        v = v.masked_fill(key_padding_mask, float("-inf"))
    order = torch.argsort(-v, dim=1, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(v.shape[1], device=v.device).expand_as(order))
    ranks = ranks.to(torch.float32)
    if normalise and v.shape[1] > 1:
        ranks = ranks / (v.shape[1] - 1)
    return ranks
