"""How far to trust each edge of Step I's graph: does the dependence survive the child's other parents and the state of
the cell?

Step I keeps an edge i → j when its fit needs the weight. On a mixture of cell types, two genes that merely differ
between the types depend on each other across all cells, and the fit takes that dependence for regulation. Each kept
edge is therefore tested once more, in a model that accounts for the cell state: x_j is regressed by least squares on
its parents in the graph and one indicator per cell state (Leiden clusters of the cells, :func:`cell_states`), on the
cells where j was not intervened on (an intervention sets j's level from outside). x_i's coefficient gets a two-sided
p-value, the larger of the t test's and the same test's with a variance that allows each cell its own (the HC3
sandwich): cell states break the t test's single variance, and genes seen in few cells break the sandwich.
Benjamini–Hochberg turns the kept edges' p-values into q-values, and an edge's confidence is 1 − q. An edge at
confidence ≥ :data:`SOLID_CONFIDENCE` is *solid*; the rest are guesses that the data, once cell states are accounted
for, do not support at that rate.

With thousands of cells many edges reach q below float precision and share confidence 1: significance no longer tells
them apart. The same regression gives each edge's size, the partial correlation of x_i and x_j given j's other parents
and the cell state (t / √(t² + df)), which orders the edges the confidence ties (:func:`edge_order`).

What the test does not catch: a dependence that the cell states do not explain but that another gene does (a parent
the graph missed, whose child and sibling then look linked). Where it is given, the pair's partial correlation given
every other gene (shrunk, as Step I's pair ranking computes it) covers that case, and :func:`edge_order` trusts an
edge only as far as the weaker of the two allows. The test is linear, so a regulation that saturates loses some power.

Where Step I's edge budget tested every gene pair given every other gene (``tau="budget"``), an edge whose pair is not
among the pairs the budget counted is a guess whatever its own test says (:func:`cap_unsupported`): the graph chose its
edges on the same cells, so among the kept edges alone a test is easily passed, and a dependence that a factor shared
by many genes draws (the cells' composition, their depth) survives the child's parents and the cell state but not
every other gene. Where the budget did not test the pairs (a fixed τ, fewer cells than genes + 10, more genes than
it tests), the edges' q-values count every gene pair the graph was chosen from, not the edges alone
(:func:`selection_q_values`), for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import anndata as ad
import numpy as np
import scanpy as sc
import scipy.sparse as sp
from scipy import stats
from scipy.stats import rankdata
from sklearn.neighbors import kneighbors_graph

from .._arrays import to_numpy
from .._errors import CapeInputError

__all__ = ["MIN_DETECTED_CELLS", "SOLID_CONFIDENCE", "STATE_RESOLUTION", "EdgeConfidence", "cap_unsupported",
           "cell_states", "edge_confidence", "edge_order", "edge_tests", "effective_cells", "selection_q_values"]

#: Leiden resolution of the cell states: coarse, so that states are cell types rather than sub-states that the
#: regulation itself draws (finer clusters of one population split along the genes' own variation and remove the
#: very dependence the test looks for).
STATE_RESOLUTION = 0.3
#: Principal components of the kNN graph the states are clustered on.
STATE_PCS = 20
#: Confidence (1 − q) from which an edge counts as solid: q ≤ 5 %.
SOLID_CONFIDENCE = 0.95
#: Fewest cells for cell states: below, every cell is one state (no kNN graph worth the name).
MIN_STATE_CELLS = 30
#: A gene whose variance rests on fewer cells than this (:func:`effective_cells`) is not tested, by an edge's test
#: here or by the robust partial-correlation test: a sum over a handful of cells has no normal limit, and two genes
#: detected in the same few cells look dependent whatever their regulation.
MIN_DETECTED_CELLS = 10


@dataclass
class EdgeConfidence:
    """Result of :func:`edge_confidence`.

    Attributes
    ----------
    confidence
        M × M, 1 − q on the graph's edges (``dag[i, j] ≠ 0``), 0 elsewhere.
    p_value
        M × M two-sided p-values of the edges' tests (NaN off the edges and where a test had no degrees of freedom).
    t
        M × M t statistics of the edges' tests (0 off the edges).
    partial_correlation
        M × M partial correlations of the edges' cause and child given the child's other parents and the cell state,
        in [−1, 1] (0 off the edges): the size of the dependence whose significance the confidence states.
    states
        The cell state of every cell (integers from 0).
    record
        What :func:`cape.tl.causal_graph` stores under ``uns["cape"]["causal_graph"]["edge_confidence"]``.
    pair_partial_correlation
        M × M partial correlations of each edge's two genes given every other gene (0 off the edges), where
        :func:`edge_confidence` was given them; else ``None``. They order the edges with the confidence
        (:func:`edge_order`).
    """

    confidence: np.ndarray
    p_value: np.ndarray
    t: np.ndarray
    partial_correlation: np.ndarray
    states: np.ndarray
    record: dict = field(default_factory=dict)
    pair_partial_correlation: np.ndarray | None = None


def cell_states(X, *, resolution: float = STATE_RESOLUTION, n_pcs: int = STATE_PCS, seed: int = 0) -> np.ndarray:
    """Leiden clusters of the cells of ``X`` (cells × genes, log-normalised): scanpy's PCA, the symmetrised
    15-nearest-neighbour graph on it, scanpy's Leiden.

    Returns one integer per cell; every cell in state 0 when there are fewer than :data:`MIN_STATE_CELLS` cells or
    fewer than three genes.
    """
    n, m = X.shape
    if n < MIN_STATE_CELLS or m < 3:
        return np.zeros(n, dtype=np.int64)
    cells = ad.AnnData(X.astype(np.float32) if sp.issparse(X) else np.asarray(X, dtype=np.float32))
    sc.pp.pca(cells, n_comps=min(n_pcs, m - 1, n - 1), random_state=seed)
    # An exact kNN graph from scikit-learn rather than sc.pp.neighbors, whose UMAP weights compile numba code on first
    # use (seconds per process, more than the clustering itself at these sizes).
    knn = kneighbors_graph(cells.obsm["X_pca"], n_neighbors=min(15, n - 1), include_self=False)
    sc.tl.leiden(cells, resolution=resolution, random_state=seed, flavor="igraph", n_iterations=2, directed=False,
                 adjacency=knn.maximum(knn.T).tocsr())
    return cells.obs["leiden"].astype(int).to_numpy()


def effective_cells(centred) -> np.ndarray:
    """Per column of ``centred`` (cells × genes, centred; a NumPy array or a torch tensor), the number of cells its
    variance rests on, (Σ x²)² / Σ x⁴: k for a gene detected in k of many cells, n/3 for a Gaussian one; unchanged by
    rescaling the gene. NumPy array out."""
    squares = centred ** 2
    total, fourth = to_numpy(squares.sum(axis=0)), to_numpy((squares ** 2).sum(axis=0))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, total ** 2 / fourth, 0.0)


def edge_tests(X, dag: np.ndarray, states: np.ndarray | None = None, intervened=None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """t statistics, two-sided p-values and partial correlations of every edge i → j of ``dag`` in the regression of
    x_j on its parents (p: the larger of the t test's and the HC3 sandwich test's, :func:`_coefficient_tests`).

    The regression has an intercept, one indicator per state of ``states`` (``None``: one state) and every parent of
    j in ``dag``; it runs on the cells where j is not ``intervened`` on (a cells × genes boolean matrix, dense or
    sparse, or ``None``). The intercept and indicators are absorbed by centring x_j and its parents within each state
    (Frisch–Waugh–Lovell: the parents' coefficients, the residuals and their covariance are those of the full
    regression), so each child costs one least-squares fit on its parents alone. Returns three M × M arrays: t (0 off
    the edges), p (NaN off the edges, where the cells leave no degrees of freedom, and where the cause or the child
    varies within the states in fewer than :data:`MIN_DETECTED_CELLS` cells: not tested) and the partial correlation
    of x_i and x_j given the rest of the regression, t / √(t² + df) (0 off the edges and without degrees of freedom).
    """
    X = X.tocsc() if sp.issparse(X) else np.asarray(X)
    n, m = X.shape
    dag = np.asarray(dag)
    if dag.shape != (m, m):
        raise CapeInputError(f"the graph is {dag.shape[0]} × {dag.shape[1]} but X has {m} genes")
    mask = None if intervened is None else sp.csc_matrix(intervened, dtype=bool)
    t, p, r = np.zeros((m, m)), np.full((m, m), np.nan), np.zeros((m, m))
    states = np.zeros(n, dtype=np.int64) if states is None else np.asarray(states)
    for j in np.flatnonzero((dag != 0).any(axis=0)):
        parents = np.flatnonzero(dag[:, j])
        cells = np.ones(n, dtype=bool) if mask is None else ~mask[:, j].toarray().ravel()
        columns = X[:, np.r_[parents, j]]
        columns = np.asarray(columns.toarray() if sp.issparse(columns) else columns, dtype=np.float64)[cells]
        centred, state_sizes = _within_state(columns, states[cells])
        t[parents, j], p[parents, j], r[parents, j] = _coefficient_tests(centred[:, :-1], centred[:, -1], state_sizes)
        varying = effective_cells(centred)
        p[parents[(varying[:-1] < MIN_DETECTED_CELLS) | (varying[-1] < MIN_DETECTED_CELLS)], j] = np.nan
    return t, p, r


def _within_state(columns: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``columns`` minus their mean within each state, and the size of each cell's state."""
    _, index, counts = np.unique(states, return_inverse=True, return_counts=True)
    index = index.ravel()
    means = np.column_stack([np.bincount(index, weights=c, minlength=counts.size) for c in columns.T])
    return columns - means[index] / counts[index, None], counts[index]


def _coefficient_tests(design: np.ndarray, y: np.ndarray, state_sizes: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """t, two-sided p and partial correlation of every coefficient of the least-squares fit of y on ``design`` (both
    centred within states; ``state_sizes``: each cell's state size, the indicators absorbed by that centring).

    t and the partial correlation are least squares' own; p is the larger of the t test's and the same test's with
    the HC3 sandwich variance (MacKinnon & White 1985), computed with the full design's leverages (the within-state
    ones plus 1 / the state's size). Each alone fails on data like a cell's: the t test where cell states or dropout
    change a gene's spread from cell to cell, the sandwich where a gene is detected in a few dozen cells (the cells
    that carry it are fitted almost exactly and leave the sandwich little to measure); the larger of the two held the
    rate on both (docs/benchmarks/edge_confidence.md), as the edge budget's two tests do.
    """
    n_tested = design.shape[1]
    beta, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
    df = design.shape[0] - round(float(np.sum(1.0 / state_sizes))) - rank
    if df < 1:
        return np.zeros(n_tested), np.full(n_tested, np.nan), np.zeros(n_tested)
    residual = y - design @ beta
    inverse = np.linalg.pinv(design.T @ design)
    variance = np.diag(inverse) * (residual @ residual) / df
    leverage = np.einsum("ij,jk,ik->i", design, inverse, design) + 1.0 / state_sizes
    with np.errstate(divide="ignore", invalid="ignore"):
        # A cell of leverage 1 (alone in its state) is fitted exactly: its residual is 0 and it adds nothing.
        weights = np.where(leverage < 1.0 - 1e-10, residual / (1.0 - leverage), 0.0) ** 2
        sandwich = np.diag(inverse @ (design.T * weights) @ design @ inverse)
        t = np.where(variance > 0, beta / np.sqrt(variance), 0.0)
        robust = np.where(sandwich > 0, np.abs(beta) / np.sqrt(sandwich), 0.0)
    p = 2.0 * stats.t.sf(np.minimum(np.abs(t), robust), df)
    return t, p, t / np.sqrt(t ** 2 + df)


def edge_confidence(X, dag: np.ndarray, *, states: np.ndarray | None = None, intervened=None,
                    resolution: float = STATE_RESOLUTION, seed: int = 0,
                    pair_partial_correlation: np.ndarray | None = None,
                    n_hypotheses: int | None = None) -> EdgeConfidence:
    """Each edge's confidence, 1 − its Benjamini–Hochberg q-value in :func:`edge_tests` given the cell states.

    Parameters
    ----------
    X
        Cells × genes, the matrix the graph was learnt on (dense or sparse).
    dag
        M × M graph (``dag[i, j] ≠ 0``: i → j).
    states
        One label per cell (e.g. annotated cell types); ``None``: Leiden clusters at ``resolution``
        (:func:`cell_states`, seeded by ``seed``).
    intervened
        Cells × genes boolean matrix of interventions (dense or sparse) or ``None``; a child's intervened cells are
        left out of its test.
    pair_partial_correlation
        M × M partial correlations of every gene pair given every other gene (e.g.
        :func:`cape.causal.shrunk_partial_correlations` of X), or ``None``; the edges' values are kept
        (:attr:`EdgeConfidence.pair_partial_correlation`) to order the edges with the confidence (:func:`edge_order`).
    n_hypotheses
        How many hypotheses the q-values count (:func:`selection_q_values`): ``None``, the edges themselves; the
        number of gene pairs the graph was chosen from, where no other test accounts for that choice (the edges were
        chosen on the same cells as the strongest of those pairs, so that among the edges alone a test is easily
        passed).

    Returns
    -------
    The :class:`EdgeConfidence`.
    """
    n = X.shape[0]
    rows, cols = np.nonzero(np.asarray(dag))
    pair = None
    if pair_partial_correlation is not None:
        if np.shape(pair_partial_correlation) != np.shape(dag):
            raise CapeInputError(f"the pair partial correlations are {np.shape(pair_partial_correlation)} but the "
                                 f"graph is {np.shape(dag)}")
        pair = np.zeros(np.shape(dag))
        pair[rows, cols] = np.asarray(pair_partial_correlation, dtype=np.float64)[rows, cols]
    if states is None:
        states = cell_states(X, resolution=resolution, seed=seed) if rows.size else np.zeros(n, dtype=np.int64)
    else:
        states = np.unique(np.asarray(states).astype(str), return_inverse=True)[1].ravel()
        if states.size != n:
            raise CapeInputError(f"{states.size} cell states for {n} cells")
    t, p, r = edge_tests(X, dag, states, intervened)
    q = selection_q_values(np.nan_to_num(p[rows, cols], nan=1.0), n_hypotheses)
    confidence = np.zeros(np.shape(dag))
    confidence[rows, cols] = 1.0 - q
    record = {"method": "regression on parents and cell states", "test": "larger p of the t test and HC3",
              "n_states": int(np.unique(states).size), "state_resolution": float(resolution),
              "solid_confidence": SOLID_CONFIDENCE,
              "n_untested": int(np.count_nonzero(~np.isfinite(p[rows, cols]))),
              "n_hypotheses": int(rows.size if n_hypotheses is None else max(n_hypotheses, rows.size)),
              "min_detected_cells": MIN_DETECTED_CELLS, **_solid_record(confidence[rows, cols])}
    return EdgeConfidence(confidence, p, t, r, states, record, pair)


def selection_q_values(p: np.ndarray, n_hypotheses: int | None = None) -> np.ndarray:
    """Benjamini–Hochberg q-values of ``p`` as the smallest of ``n_hypotheses`` p-values (``None``: of ``p`` alone).

    The others are not known, only that they are no smaller, so they are taken as 1: q_(i) = min over j ≥ i of
    p_(j) · m / j, capped at 1, with m = max(``n_hypotheses``, len(p)). With m = len(p) this is
    ``scipy.stats.false_discovery_control``.
    """
    p = np.asarray(p, dtype=np.float64)
    if not p.size:
        return np.zeros(0)
    m = p.size if n_hypotheses is None else max(int(n_hypotheses), p.size)
    order = np.argsort(p, kind="stable")
    scaled = p[order] * m / np.arange(1, p.size + 1)
    q = np.empty(p.size)
    q[order] = np.minimum(np.minimum.accumulate(scaled[::-1])[::-1], 1.0)
    return q


def cap_unsupported(result: EdgeConfidence, dag: np.ndarray, pair_tests: tuple[tuple[np.ndarray, np.ndarray],
                    np.ndarray], n_supported: int, test: str = "the edge budget's test") -> EdgeConfidence:
    """``result`` with the confidence of every edge whose gene pair the edge budget did not count made a guess.

    ``pair_tests`` are the budget's tests of every gene pair given every other gene ((pairs (i < j), p), NaN where a
    pair was not tested) and ``n_supported`` the number of pairs it counted (its significant pairs less those called on
    a permuted copy of the cells): the supported pairs are the ``n_supported`` with the smallest p. An edge on any other
    pair keeps at most 1 − its pair's Benjamini–Hochberg q-value (over every pair tested, 0 where its pair was not
    tested), and stays below :data:`SOLID_CONFIDENCE`; an edge on a supported pair keeps its confidence. The record
    counts the edges on unsupported pairs (``n_unsupported``), and its solid figures follow the capped confidence;
    ``test`` names the test in it.
    """
    (first, second), p = pair_tests
    m = np.shape(dag)[0]
    tested = np.isfinite(p)
    q = np.ones(p.shape)
    if tested.any():
        q[tested] = stats.false_discovery_control(p[tested])
    supported = np.zeros(p.shape, dtype=bool)
    supported[np.argsort(np.where(tested, p, np.inf), kind="stable")[:max(int(n_supported), 0)]] = True
    supported &= tested
    ceiling = np.ones((m, m))
    ceiling[first, second] = ceiling[second, first] = np.where(
        supported, 1.0, np.minimum(1.0 - q, np.nextafter(SOLID_CONFIDENCE, 0.0)))
    rows, cols = np.nonzero(np.asarray(dag))
    confidence = result.confidence.copy()
    confidence[rows, cols] = np.minimum(confidence[rows, cols], ceiling[rows, cols])
    record = {**result.record, **_solid_record(confidence[rows, cols]), "pair_test": test,
              "n_pairs_supported": int(supported.sum()),
              "n_unsupported": int(np.count_nonzero(ceiling[rows, cols] < 1.0))}
    return replace(result, confidence=confidence, record=record)


def _solid_record(confidence: np.ndarray) -> dict:
    """The record's solid figures of the kept edges' confidences."""
    solid = int(np.count_nonzero(confidence >= SOLID_CONFIDENCE))
    return {"n_solid": solid, "solid_fraction": float(solid / confidence.size) if confidence.size else float("nan"),
            "median_confidence": float(np.median(confidence)) if confidence.size else float("nan")}


def edge_order(confidence: np.ndarray, partial_correlation: np.ndarray,
               pair_partial_correlation: np.ndarray | None = None) -> np.ndarray:
    """Rank of each entry (0: least trusted, ties at the same rank): by confidence, ties by |partial correlation|;
    with ``pair_partial_correlation``, by the lower of that rank and the rank of |pair partial correlation|.

    The second ranking is of each pair's partial correlation given every other gene
    (:attr:`EdgeConfidence.pair_partial_correlation`): an edge is trusted as far as the weaker of its two showings
    allows, the test given the child's other parents and the cell state, and the dependence left once every other gene
    is accounted for (which a gene the graph missed does not explain away). Takes arrays of any shape (e.g. one value
    per edge) and returns float ranks of that shape, so that a higher rank is a more trusted edge: the order of the
    report's table of Step I's edges.
    """
    confidence, size = np.asarray(confidence, dtype=np.float64), np.abs(np.asarray(partial_correlation, np.float64))
    if confidence.shape != size.shape:
        raise CapeInputError(f"{confidence.shape} confidences but {size.shape} partial correlations")
    keys = np.column_stack([confidence.ravel(), size.ravel()])
    _, dense = np.unique(keys, axis=0, return_inverse=True)
    if pair_partial_correlation is not None:
        pair = np.abs(np.asarray(pair_partial_correlation, dtype=np.float64))
        if pair.shape != confidence.shape:
            raise CapeInputError(f"{confidence.shape} confidences but {pair.shape} pair partial correlations")
        # Average ranks on both sides put the two orders on one scale (1 … n) before the lower is taken.
        _, dense = np.unique(np.minimum(rankdata(dense.ravel()), rankdata(pair.ravel())), return_inverse=True)
    return dense.ravel().astype(np.float64).reshape(confidence.shape)

