"""Which gene pairs the edge budget keeps: the fit's weights and the partial correlations ranked together.

``tau="budget"`` keeps K gene pairs, K the number of significant partial correlations (:func:`edge_budget`). Which
K is a ranking question. The fit's weights alone rank well where the regulation is close to its model (linear
networks pushed through counts) and worse than the partial correlations they were screened from where it is not
(Hill kinetics, saturating regulation); neither ranking is better on every count simulator
(docs/benchmarks/count_panel.md). The consensus ranking averages the two rankings' normalised ranks (a Borda count,
the rule of the DREAM5 community networks, Marbach et al. 2012), so that a pair is kept when both methods rank it
high; the fit still orients every kept pair and gives it its weight.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata

#: How ``tau="budget"`` ranks the gene pairs: ``"consensus"`` (the fit and the partial correlations together) or
#: ``"fit"`` (the fit's weights alone, the K heaviest directed weights).
PAIR_RANKINGS = ("consensus", "fit")
PAIR_RANKING = "consensus"


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


def pair_score_matrix(n_genes: int, pairs: tuple[np.ndarray, np.ndarray], scores: np.ndarray) -> np.ndarray:
    """The pairs' scores as a symmetric n×n matrix (0 on the diagonal and for pairs without a score)."""
    out = np.zeros((n_genes, n_genes))
    out[pairs[0], pairs[1]] = scores
    return np.maximum(out, out.T)


def top_pairs_oriented(A: np.ndarray, pairs: tuple[np.ndarray, np.ndarray], scores: np.ndarray, k: int,
                       floor: float) -> np.ndarray:
    """The ``k`` best-scoring pairs as directed edges with the fit's weights (before cycles are broken).

    Each kept pair points the way of its heavier fitted weight (ties: i → j) and keeps that weight. A pair whose
    heavier weight is at or below ``floor`` is left out: the fit gives it no equation, so it would be an edge
    without a direction or a weight. Ties in score go to the heavier fitted weight.
    """
    A = np.asarray(A)
    i, j = pairs
    weight = fit_pair_weights(A, pairs)
    order = np.lexsort((-weight, -np.asarray(scores)))[:max(int(k), 0)]
    order = order[weight[order] > floor]
    a, b = i[order], j[order]
    forward = np.abs(A[a, b]) >= np.abs(A[b, a])
    source, target = np.where(forward, a, b), np.where(forward, b, a)
    chosen = np.zeros_like(A)
    chosen[source, target] = A[source, target]
    return chosen
