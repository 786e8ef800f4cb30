"""Structure-recovery metrics: gcastle's MetricsDAG (SHD, TPR, FDR, F1, …) plus AUPRC and BEELINE's early precision
ratio over edge weights."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score

from .._arrays import dense
from ..data.simulate import castle_quietly, import_castle

__all__ = ["dag_metrics", "early_precision_ratio"]


def dag_metrics(true, estimated) -> dict[str, float]:
    """Compare an estimated graph with the true one (A[i, j] ≠ 0 means i → j).

    Returns ``shd``, ``tpr``, ``fdr``, ``fpr``, ``f1``, ``precision``, ``nnz`` from gcastle's ``MetricsDAG``
    (which counts a pair of opposite edges in the estimate as one undirected edge), and ``auprc``: the
    average precision of ranking every ordered off-diagonal pair by |estimated weight| against the true
    directed edges (NaN when the true graph has no edge), and ``epr``: :func:`early_precision_ratio` of the same
    ranking.
    """
    T, E = dense(true), dense(estimated)
    if T.shape != E.shape or T.ndim != 2 or T.shape[0] != T.shape[1]:
        raise ValueError(f"true and estimated must be square and of equal shape, got {T.shape} and {E.shape}")
    B_true = (T != 0).astype(int)
    B_est = (E != 0).astype(int)
    np.fill_diagonal(B_true, 0)
    np.fill_diagonal(B_est, 0)
    MetricsDAG = import_castle("metrics").MetricsDAG
    with castle_quietly(), np.errstate(invalid="ignore", divide="ignore"):
        metrics = MetricsDAG(B_est, B_true).metrics
    off = ~np.eye(T.shape[0], dtype=bool)
    labels, scores = B_true[off], np.abs(E[off])
    # gcastle returns NaN precision/F1 when nothing was predicted or nothing is right: F1 is 0 then.
    f1 = float(metrics["F1"]) if np.isfinite(metrics["F1"]) else 0.0
    auprc = float(average_precision_score(labels, scores)) if labels.any() else float("nan")
    return {
        "shd": float(metrics["shd"]),
        "tpr": float(metrics["tpr"]),
        "fdr": float(metrics["fdr"]),
        "fpr": float(metrics["fpr"]),
        "f1": f1,
        "precision": float(metrics["precision"]),
        "nnz": float(metrics["nnz"]),
        "auprc": auprc,
        "epr": early_precision_ratio(T, E),
    }


def early_precision_ratio(true, scores) -> float:
    """BEELINE's early precision ratio (Pratapa et al. 2020) of ranking ordered pairs by ``|scores|``.

    k is the number of true directed edges (self-loops ignored). The early precision is the share of true edges
    among the pairs whose |score| is at least the k-th largest (ties at the cut all count, pairs scored 0 never),
    and the ratio divides it by a random ranking's, the true graph's density k / (M(M − 1)). 1 is chance, and
    the largest possible value is 1 / density. NaN when the true graph has no edge; 0 when no pair has a
    nonzero score.
    """
    T, S = dense(true), np.abs(dense(scores))
    if T.shape != S.shape or T.ndim != 2 or T.shape[0] != T.shape[1]:
        raise ValueError(f"true and scores must be square and of equal shape, got {T.shape} and {S.shape}")
    off = ~np.eye(T.shape[0], dtype=bool)
    labels, values = T[off] != 0, S[off]
    k = int(labels.sum())
    if k == 0:
        return float("nan")
    nonzero = values[values > 0]
    if nonzero.size == 0:
        return 0.0
    cut = np.sort(nonzero)[::-1][min(k, nonzero.size) - 1]
    chosen = values >= cut
    precision = float(labels[chosen].mean())
    return precision / (k / labels.size)
