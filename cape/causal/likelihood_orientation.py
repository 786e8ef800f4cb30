"""Orienting a graph's edges by the Gaussian likelihood of the cells: the turns a likelihood-ratio test supports.

Under Step I's edge budget the pair ranking chooses the gene pairs and the fit only points them. From observational
cells, a linear-Gaussian model tells some directions apart (those that make or break a v-structure) and is blind
to the others. This is the second phase of max-min hill climbing (Tsamardinos, Brown & Aliferis 2006, Mach. Learn.
65:31), restricted to turning edges round: the skeleton stays as it is, so the number of edges, and with it
BIC's penalty, does not change, and only the likelihood decides.

With the genes standardised, the mean log-likelihood of a DAG is −½ Σ_j log σ²_j (constants dropped), σ²_j the
residual variance of gene j regressed on its parents (:func:`family_log_variance`). Turning i → j changes only the
terms of i and j. The greedy search (:func:`orient_by_likelihood`) makes the best turn that keeps the graph acyclic
(of equal gains, the turn of the lowest (i, j)), while its gain g passes the likelihood-ratio test,
2·n·g > χ²₁(1 − level). Without that test most turns are gains of noise, and they cost as many right directions as
they find. Equal gains are not rare: two parents of one child that have no parents themselves gain the same.

NumPy and networkx; the covariance in float64.
"""

from __future__ import annotations

from itertools import pairwise

import networkx as nx
import numpy as np
from scipy.stats import chi2

from .._arrays import correlation_matrix

__all__ = ["LIKELIHOOD_ORIENT_LEVEL", "family_log_variance", "orient_by_likelihood"]

#: Level of the likelihood-ratio test a turn must pass (:func:`orient_by_likelihood`).
LIKELIHOOD_ORIENT_LEVEL = 0.05


def family_log_variance(correlation: np.ndarray, child: int, parents) -> float:
    """½ log of the residual variance of ``child`` regressed on ``parents`` (its share of −log-likelihood per cell).

    ``correlation``: the genes' correlation matrix (float64). Empty ``parents``: ½ log 1 = 0.
    """
    parents = sorted(parents)
    if not parents:
        return 0.5 * float(np.log(correlation[child, child]))
    block = correlation[np.ix_(parents, parents)]
    slopes = np.linalg.solve(block, correlation[parents, child])
    residual = correlation[child, child] - correlation[child, parents] @ slopes
    return 0.5 * float(np.log(max(residual, 1e-12)))


def orient_by_likelihood(X, dag: np.ndarray, level: float = LIKELIHOOD_ORIENT_LEVEL,
                         max_turns: int | None = None) -> tuple[np.ndarray, int]:
    """Turn ``dag``'s edges round where the Gaussian likelihood of the standardised genes says so.

    Parameters
    ----------
    X
        Cells × genes (NumPy array or SciPy sparse matrix), the matrix the graph was learnt from.
    dag
        The weighted DAG (M×M, ``dag[i, j] ≠ 0``: i → j).
    level
        Each turn must pass a likelihood-ratio test at this level: 2·n·(gain in mean log-likelihood) > χ²₁(1 − level).
    max_turns
        At most this many turns (default: as many as there are edges, ten times over).

    Returns
    -------
    The DAG with the turned edges (each keeps its weight: on standardised genes a pair's regression slope is the same
    both ways) and the number of turns made. The skeleton and the number of edges are unchanged, and the result is
    acyclic (a turn that would close a cycle is never made).
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    dag = np.asarray(dag)
    # Only the genes on edges have families that a turn changes: their correlations are all the search reads.
    on_edges = np.flatnonzero((dag != 0).any(axis=0) | (dag != 0).any(axis=1))
    if on_edges.size < dag.shape[0]:
        turned, turns = orient_by_likelihood(X[:, on_edges], dag[np.ix_(on_edges, on_edges)], level, max_turns)
        out = dag.copy()
        out[np.ix_(on_edges, on_edges)] = turned
        return out, turns
    n = X.shape[0]
    correlation = correlation_matrix(X)
    np.fill_diagonal(correlation, 1.0)  # a constant gene: no variance to explain, so no gain from any turn
    min_gain = chi2.ppf(1 - level, 1) / (2 * n)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(dag.shape[0]))
    graph.add_edges_from(zip(*np.nonzero(dag), strict=True))
    parents = {j: set(graph.predecessors(j)) for j in graph}
    limit = 10 * graph.number_of_edges() if max_turns is None else max_turns
    out = dag.copy()
    turns = 0
    cache: dict[tuple[int, frozenset], float] = {}  # a turn changes two families: the others' terms are reused

    def term(child: int, family: set) -> float:
        key = (child, frozenset(family))
        if key not in cache:
            cache[key] = family_log_variance(correlation, child, family)
        return cache[key]

    def gain(i: int, j: int) -> float:
        before = term(i, parents[i]) + term(j, parents[j])
        return before - (term(i, parents[i] | {j}) + term(j, parents[j] - {i}))

    # A turn of i → j changes the families of i and j only, so only the gains of edges at i or j change; and an
    # edge that a path blocked stays blocked while every edge of that path (its witness) stands. Each step therefore
    # costs the edges at two genes and the paths of the candidates that lost theirs, not a pass over every edge.
    gains = {edge: gain(*edge) for edge in graph.edges}
    witnesses: dict[tuple[int, int], frozenset] = {}
    while turns < limit:
        move = None
        for edge in sorted((e for e, g in gains.items() if g > min_gain), key=lambda e: (-gains[e], e)):
            if edge in witnesses:
                continue
            path = _other_path(graph, *edge)
            if path is None:
                move = edge
                break
            witnesses[edge] = frozenset(pairwise(path))
        if move is None:
            break
        i, j = move
        graph.remove_edge(i, j)
        graph.add_edge(j, i)
        parents[j].discard(i)
        parents[i].add(j)
        out[j, i], out[i, j] = out[i, j], 0
        turns += 1
        del gains[move]
        witnesses = {e: w for e, w in witnesses.items() if move not in w}
        for gene in (i, j):
            for edge in (*graph.in_edges(gene), *graph.out_edges(gene)):
                gains[edge] = gain(*edge)
    return out, turns


def _other_path(graph: nx.DiGraph, i: int, j: int) -> list[int] | None:
    """A path from i to j without the edge i → j (turning that edge would then close a cycle), or ``None``."""
    graph.remove_edge(i, j)
    try:
        return nx.shortest_path(graph, i, j)
    except nx.NetworkXNoPath:
        return None
    finally:
        graph.add_edge(i, j)

