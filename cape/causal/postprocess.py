"""From a learnt weighted adjacency to a guaranteed DAG: threshold at τ, then break leftover cycles."""

from __future__ import annotations

import networkx as nx
import numpy as np

__all__ = ["is_dag", "make_dag", "threshold"]


def threshold(A: np.ndarray, tau: float) -> np.ndarray:
    """A ∘ 1(|A| > τ) with the diagonal cleared (self-loops are never causal edges here)."""
    if not np.isfinite(tau) or tau < 0:
        raise ValueError(f"tau must be a finite number ≥ 0, got {tau}")
    out = np.where(np.abs(A) > tau, A, 0.0).astype(A.dtype, copy=False)
    np.fill_diagonal(out, 0.0)
    return out


def is_dag(A: np.ndarray) -> bool:
    """Whether the nonzero pattern of A (A[i, j] ≠ 0: i → j) has no directed cycle (self-loops included)."""
    A = np.asarray(A)
    if np.any(np.diag(A) != 0):
        return False
    return nx.is_directed_acyclic_graph(nx.from_numpy_array((A != 0).astype(np.int8), create_using=nx.DiGraph))


def make_dag(A: np.ndarray, tau: float = 0.0) -> tuple[np.ndarray, int]:
    """Threshold A at τ, then remove the weakest edge (smallest |weight|) of each remaining cycle.

    Cycles are found inside strongly connected components, one at a time, until none is left, so the
    result is always a DAG. Returns the DAG (same dtype, weights of kept edges unchanged) and the number of
    edges removed by cycle breaking (not counting those removed by the threshold).
    """
    out = threshold(np.asarray(A), tau)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(out.shape[0]))
    rows, cols = np.nonzero(out)
    graph.add_weighted_edges_from((int(i), int(j), abs(float(out[i, j]))) for i, j in zip(rows, cols, strict=True))
    removed = 0
    pending = [c for c in nx.strongly_connected_components(graph) if len(c) > 1]
    while pending:
        component = pending.pop()
        sub = graph.subgraph(component)
        cycle = nx.find_cycle(sub)
        # Ties broken by the edge's indices, so the result is deterministic.
        i, j = min(((e[0], e[1]) for e in cycle), key=lambda e: (graph.edges[e]["weight"], e))
        graph.remove_edge(i, j)
        out[i, j] = 0
        removed += 1
        pending.extend(c for c in nx.strongly_connected_components(graph.subgraph(component)) if len(c) > 1)
    return out, removed
