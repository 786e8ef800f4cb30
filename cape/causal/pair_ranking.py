"""Which gene pairs the edge budget keeps: the fit's weights and the partial correlations ranked together.

``tau="budget"`` keeps K gene pairs, K the number of significant partial correlations (:func:`edge_budget`). Which
K is a ranking question. The fit's weights alone rank well where the regulation is close to its model (linear
networks pushed through counts) and worse than the partial correlations they were screened from where it is not
(Hill kinetics, saturating regulation); neither ranking is better on every count simulator
(docs/benchmarks/count_panel.md). The consensus ranking averages the two rankings' normalised ranks (a Borda count,
the rule of the DREAM5 community networks, Marbach et al. 2012), so that a pair is kept when both methods rank it
high; the fit still orients every kept pair (the other way where its heavier direction would close a cycle of heavier
edges: :func:`cape.causal.orient_acyclic`) and gives it its weight.

``"shrunk_partial_correlation"`` ranks the pairs by their shrunk partial correlation alone (the correlation matrix of
the genes shrunk towards the identity, then inverted; the intensity is the one under which held-out cells are most
likely): the same quantity the budget's tests count, estimated with less variance where genes are nearly collinear,
as dropouts and cell mixtures make them, and moved towards the pairs' plain correlations as far as the cells support.
The fit then only orients and weights the kept pairs.

``"auto"`` (the default) picks between the two by what the data hold: the consensus where some cells carry
intervention labels, the shrunk partial correlations where every cell is observational. On observational count
simulators the shrunk partial correlations ranked at least as well as the consensus; on Sachs' cells, pooled over
interventions, the consensus ranked better, with the labels and also without them, which the rule cannot tell
(docs/benchmarks/count_panel.md).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from scipy.linalg import pinvh
from scipy.stats import rankdata
from sklearn.covariance import ledoit_wolf

from .._arrays import add_to_diagonal, float64_on, namespace, to_numpy
from .postprocess import covariance

#: How ``tau="budget"`` ranks the gene pairs: ``"auto"`` (:func:`pair_ranking_for`), ``"consensus"`` (the fit and
#: the partial correlations together), ``"fit"`` (the fit's weights alone, the K heaviest directed weights) or
#: ``"shrunk_partial_correlation"`` (the shrunk partial correlations alone, the fit orienting).
PAIR_RANKINGS = ("auto", "consensus", "fit", "shrunk_partial_correlation")
PAIR_RANKING = "auto"
#: How each ranking chose the kept pairs, in words (reports and logs); the fit's own ranking needs none.
PAIR_RANKING_WORDS = {"consensus": "the pairs ranked by the fit and the partial correlations together",
                      "shrunk_partial_correlation": "the pairs ranked by their shrunk partial correlation"}


def pair_ranking_for(ranking: str, intervened=None) -> str:
    """The ranking ``ranking`` stands for on data whose cells × genes intervention mask is ``intervened``: ``"auto"``
    is ``"consensus"`` where some cell is labelled as intervened on and ``"shrunk_partial_correlation"`` where none
    is (``intervened`` ``None`` or all False); any other ranking stands for itself."""
    if ranking not in PAIR_RANKINGS:
        raise ValueError(f"unknown pair ranking {ranking!r}")
    if ranking != "auto":
        return ranking
    labelled = intervened is not None and bool((intervened != 0).sum())
    return "consensus" if labelled else "shrunk_partial_correlation"


def fit_pair_weights(A: np.ndarray, pairs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Each pair's heavier fitted weight, max(|A_ij|, |A_ji|), for the pairs ``(i, j)``."""
    i, j = pairs
    A = np.asarray(A)
    return np.maximum(np.abs(A[i, j]), np.abs(A[j, i])).astype(np.float64)


def consensus_scores(A: np.ndarray, pairs: tuple[np.ndarray, np.ndarray], p: np.ndarray) -> np.ndarray:
    """The Borda score of each pair: the mean of its normalised ranks (in (0, 1], 1 the best) by the fit's weight
    (:func:`fit_pair_weights`) and by its partial correlation's p-value (smaller ranks higher).

    Ties share their average rank; an untested pair (NaN p-value) ranks last by the test. The score only orders
    pairs: it is invariant to any increasing transform of either input.
    """
    weight = fit_pair_weights(A, pairs)
    p = np.where(np.isfinite(p), np.asarray(p, dtype=np.float64), np.inf)
    if weight.size == 0:
        return weight
    return 0.5 * (rankdata(weight) + rankdata(-p)) / weight.size


#: Shrinkage intensities among which :func:`likelihood_shrinkage` chooses (0: the sample correlation matrix itself).
SHRINKAGE_GRID = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: Folds of the cells over which it scores each intensity; with fewer than two cells per fold, Ledoit–Wolf's rule.
SHRINKAGE_FOLDS = 5


def shrunk_covariance(S, shrinkage: float):
    """(1 − s)·S + s·(tr S / M)·I: S shrunk towards the identity scaled to S's mean variance (a NumPy array, or a
    torch tensor on its device)."""
    m = S.shape[0]
    shrunk = (1.0 - shrinkage) * S
    add_to_diagonal(shrunk, shrinkage * (float(S.trace()) / max(m, 1)))
    return shrunk


def likelihood_shrinkage(Z: np.ndarray, grid=SHRINKAGE_GRID, folds: int = SHRINKAGE_FOLDS, seed: int = 0,
                         device=None) -> float:
    """The shrinkage of :func:`shrunk_covariance` under which held-out cells are most likely (Gaussian likelihood,
    summed over ``folds`` folds of the cells, split at random with ``seed``; ties go to the smaller intensity).

    Each fold costs one eigendecomposition of its training covariance, after which every intensity in ``grid`` is
    scored in O(M). Ledoit–Wolf's rule chooses the shrinkage that best estimates the covariance in Frobenius norm;
    the likelihood asks how well the shrunk matrix's inverse, whose entries are the partial correlations, describes
    new cells. Columns must vary (the caller drops constant ones). With fewer than ``2 · folds`` cells, Ledoit–Wolf's
    intensity. ``device``: ``None`` for NumPy, or a torch device on which to compute the folds' moments and
    eigendecompositions (the pipeline's CUDA runs).
    """
    Z = np.asarray(Z, dtype=np.float64)
    n = Z.shape[0]
    if n < 2 * folds or Z.shape[1] == 0:
        return float(ledoit_wolf(Z)[1]) if Z.shape[1] else 0.0
    grid = np.asarray(grid, dtype=np.float64)
    parts = np.array_split(np.random.default_rng(seed).permutation(n), folds)
    score = np.zeros(grid.size)
    for eigenvalues, spread in _fold_spectra(float64_on(Z, device), parts, namespace(device)):
        scale = eigenvalues.mean()
        d = (1.0 - grid[:, None]) * eigenvalues[None, :] + grid[:, None] * scale
        with np.errstate(divide="ignore", invalid="ignore"):
            fold = -0.5 * (np.log(d) + spread[None, :] / d).sum(axis=1)
        score += np.where((d > 0).all(axis=1), fold, -np.inf)
    return float(grid[int(np.argmax(score))])


def _fold_spectra(Z, parts: list[np.ndarray], xp):
    """Per fold, as NumPy arrays: the eigenvalues of the other cells' covariance, and the fold's second moments about
    the other cells' centre along each of its eigenvectors (Z a NumPy array or a tensor, ``xp`` its module)."""
    n = Z.shape[0]
    # A training set's moments are the totals less its fold's. The folds' cross-products are made one at a time, not
    # kept, and no genes × genes array is made that the eigendecomposition does not need: at 10,000 genes each is
    # 0.8 GB.
    gram_all, sum_all = Z.T @ Z, Z.sum(axis=0)
    for part in parts:
        gram, total = Z[part].T @ Z[part], Z[part].sum(axis=0)
        n_test, n_train = part.size, n - part.size
        centre = (sum_all - total) / n_train
        training = gram_all - gram
        training /= n_train
        training -= xp.outer(centre, centre)
        eigenvalues, vectors = xp.linalg.eigh(training)
        del training
        # the held-out cells' second moments about the training centre, T = G/n_t − a cᵀ − c aᵀ + c cᵀ (G their
        # cross-products, a their mean, c the centre), seen along each eigenvector v: vᵀGv/n_t − 2(vᵀa)(vᵀc) + (vᵀc)²
        along_mean, along_centre = vectors.T @ (total / n_test), vectors.T @ centre
        spread = xp.einsum("ij,ij->j", vectors, gram @ vectors) / n_test
        spread += along_centre ** 2 - 2.0 * along_mean * along_centre
        yield to_numpy(eigenvalues), to_numpy(spread)
        del gram, vectors


def shrunk_partial_correlations(X, shrinkage: float | None = None, seed: int = 0, device=None) -> np.ndarray:
    """M×M partial correlations of the columns of X (zero diagonal) from their correlation matrix shrunk towards the
    identity (:func:`shrunk_covariance`), then inverted; constant columns get 0 everywhere.

    ``shrinkage``: the intensity s in [0, 1] (1: no partial correlation left); ``None`` (default): chosen by the
    likelihood of held-out cells (:func:`likelihood_shrinkage`, folds drawn with ``seed``). ``device``: ``None`` for
    NumPy, or a torch device on which to compute the covariance, its inverse and the shrinkage's folds.
    """
    X = np.asarray(X.toarray() if sp.issparse(X) else X, dtype=np.float64)
    sd = X.std(axis=0)
    Z = (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    if shrinkage is None:
        shrinkage = likelihood_shrinkage(Z[:, sd > 0], seed=seed, device=device)
    if not 0.0 <= shrinkage <= 1.0:
        raise ValueError(f"shrinkage must be in [0, 1], got {shrinkage}")
    shrunk = shrunk_covariance(covariance(Z, device, ddof=0).reshape(Z.shape[1], Z.shape[1]), shrinkage)
    try:  # positive definite once shrunk (s > 0): a plain inverse; at s = 0 a singular matrix takes the pseudo-inverse
        precision = namespace(device).linalg.inv(shrunk)
    except (np.linalg.LinAlgError, torch.linalg.LinAlgError):
        precision = pinvh(to_numpy(shrunk))
    precision = to_numpy(precision)
    d = np.sqrt(np.clip(np.diag(precision), 1e-300, None))
    R = -precision / np.outer(d, d)
    R[:, sd == 0] = 0.0
    R[sd == 0] = 0.0
    np.fill_diagonal(R, 0.0)
    return R


def ranked_pairs(ranking: str, A: np.ndarray, tests: tuple | None, X, device=None, shrunk: np.ndarray | None = None
                 ) -> tuple[tuple, np.ndarray] | None:
    """The gene pairs ``(i, j)`` (i < j) and their scores (higher first) by which ``tau="budget"`` keeps pairs under
    ``ranking`` (:data:`PAIR_RANKINGS`); ``None`` where the fit's weights alone decide: ``"fit"``, or no partial
    correlation ``tests`` ((pairs, p) on every cell, as the budget needs them). ``"auto"`` must be resolved first
    (:func:`pair_ranking_for`). ``shrunk``: X's :func:`shrunk_partial_correlations` where already computed."""
    if ranking not in PAIR_RANKINGS or ranking == "auto":
        raise ValueError(f"unknown or unresolved pair ranking {ranking!r}")
    if ranking == "fit" or tests is None:
        return None
    pairs, p = tests
    if ranking == "consensus":
        return pairs, consensus_scores(A, pairs, p)
    return pairs, np.abs((shrunk_partial_correlations(X, device=device) if shrunk is None else shrunk)[pairs])


def pair_score_matrix(n_genes: int, pairs: tuple[np.ndarray, np.ndarray], scores: np.ndarray) -> np.ndarray:
    """The pairs' scores as a symmetric n×n matrix (0 on the diagonal and for pairs without a score)."""
    out = np.zeros((n_genes, n_genes))
    out[pairs[0], pairs[1]] = scores
    return np.maximum(out, out.T)


def top_pairs_oriented(A: np.ndarray, pairs: tuple[np.ndarray, np.ndarray], scores: np.ndarray, k: int,
                       floor: float) -> np.ndarray:
    """The ``k`` best-scoring pairs that the fit weights above ``floor``, as directed edges with the fit's weights
    (before cycles are broken).

    Each kept pair points the way of its heavier fitted weight (ties: i → j) and keeps that weight. A pair whose
    heavier weight is at or below ``floor`` is passed over and the next-ranked pair takes its place: the fit gives
    it no equation, so it would be an edge without a direction or a weight, and the budget counts pairs the data
    support, not ranks. Ties in score go to the heavier fitted weight.
    """
    A = np.asarray(A)
    i, j = pairs
    weight = fit_pair_weights(A, pairs)
    order = np.lexsort((-weight, -np.asarray(scores)))
    order = order[weight[order] > floor][:max(int(k), 0)]
    a, b = i[order], j[order]
    forward = np.abs(A[a, b]) >= np.abs(A[b, a])
    source, target = np.where(forward, a, b), np.where(forward, b, a)
    chosen = np.zeros_like(A)
    chosen[source, target] = A[source, target]
    return chosen
