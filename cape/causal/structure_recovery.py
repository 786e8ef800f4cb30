"""Structure-recovery metrics: gcastle's MetricsDAG (SHD, TPR, FDR, F1, …) plus AUPRC over edge weights."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score

from .._arrays import dense
from ..data.simulate import castle_quietly, import_castle

__all__ = ["dag_metrics"]


def dag_metrics(true, estimated) -> dict[str, float]:
    """Compare an estimated graph with the true one (A[i, j] ≠ 0 means i → j).

    Returns ``shd``, ``tpr``, ``fdr``, ``fpr``, ``f1``, ``precision``, ``nnz`` from gcastle's ``MetricsDAG``
    (which counts a pair of opposite edges in the estimate as one undirected edge), and ``auprc``: the
    average precision of ranking every ordered off-diagonal pair by |estimated weight| against the true
    directed edges (NaN when the true graph has no edge).
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
    }
