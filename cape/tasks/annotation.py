"""Cell-type annotation (CAPE Sec. 5.3, Supp. E.2, F.1.1): labels, the stratified 30/70 fine-tune/test split and
its record in ``obs["cape_split"]``, the fine-tuning recipe, accuracy and macro-F1, and the logistic-regression-on-PCA
baseline on the same split. Used by :func:`cape.tl.annotate`, ``cape train``/``evaluate`` and the benchmarks."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anndata as ad
import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score
from sklearn.model_selection import train_test_split

from .._errors import CapeInputError
from .clustering import expression_matrix, pca_embedding
from .labels import SPLIT_KEY, checked_labels

logger = logging.getLogger("cape")

FINE_TUNE_FRACTION = 0.3  # Supp. F.1.1: held-out data split 3:7 into fine-tuning and test sets


@dataclass(frozen=True)
class AnnotationSplit:
    """Positions (into the labelled cells) of the fine-tuning and test cells."""

    fine_tune: np.ndarray
    test: np.ndarray
    seed: int
    fine_tune_fraction: float


def annotation_split(labels: Sequence[str] | pd.Series, *, seed: int = 0,
                     fine_tune_fraction: float = FINE_TUNE_FRACTION) -> AnnotationSplit:
    """Stratified split of cells into fine-tune (``fine_tune_fraction``) and test sets, reproducible from ``seed``.

    Every class appears on both sides, so each needs at least 2 cells, and each side must hold at least one cell
    per class; otherwise :class:`cape.CapeInputError` says the dataset is too small.
    """
    y = np.asarray(labels).astype(str)
    if not 0 < fine_tune_fraction < 1:
        raise CapeInputError(f"fine_tune_fraction must be in (0, 1), got {fine_tune_fraction}")
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2:
        raise CapeInputError(f"labels have {len(classes)} class; annotation needs at least 2")
    if counts.min() < 2:
        raise CapeInputError(f"class {classes[np.argmin(counts)]!r} has 1 cell; a stratified split needs at least 2")
    n_ft = int(np.floor(fine_tune_fraction * len(y)))
    if n_ft < len(classes) or len(y) - n_ft < len(classes):
        raise CapeInputError(f"dataset too small for the {fine_tune_fraction:.0%}/{1 - fine_tune_fraction:.0%} split: "
                             f"{len(y)} cells in {len(classes)} classes (each side needs a cell of every class)")
    idx = np.arange(len(y))
    ft, test = train_test_split(idx, train_size=n_ft, stratify=y, random_state=seed, shuffle=True)
    return AnnotationSplit(np.sort(ft), np.sort(test), seed, fine_tune_fraction)


def validation_part(split: AnnotationSplit, labels: Sequence[str] | pd.Series, fraction: float = 0.5
                    ) -> AnnotationSplit:
    """The fine-tune cells of ``split`` split again, stratified with the same seed: ``fraction`` of them to
    fine-tune on and the rest to score. Choices made on it (a default, a setting) never see ``split``'s test cells.
    """
    inner = annotation_split(np.asarray(labels)[split.fine_tune], seed=split.seed, fine_tune_fraction=fraction)
    return AnnotationSplit(split.fine_tune[inner.fine_tune], split.fine_tune[inner.test], split.seed,
                           split.fine_tune_fraction * fraction)


def split_roles(adata: ad.AnnData, labels: pd.Series, *, seed: int = 0,
                fine_tune_fraction: float = FINE_TUNE_FRACTION) -> tuple[np.ndarray, AnnotationSplit | None]:
    """The role of every cell of ``adata`` (see :func:`roles`) under the :func:`annotation_split` of the labelled
    cells (``labels`` from :func:`~cape.tasks.labels.checked_labels`), and that split.

    ``fine_tune_fraction=1`` fine-tunes on every labelled cell (no test cells; the split is then ``None``).
    """
    if not 0 < fine_tune_fraction <= 1:
        raise CapeInputError(f"fine_tune_fraction must be in (0, 1], got {fine_tune_fraction}")
    if fine_tune_fraction == 1:
        return roles(adata, labels, None), None
    split = annotation_split(labels, seed=seed, fine_tune_fraction=fine_tune_fraction)
    return roles(adata, labels, split), split


def roles(adata: ad.AnnData, labels: pd.Series, split: AnnotationSplit | None) -> np.ndarray:
    """``"fine_tune"`` / ``"test"`` for the labelled cells by ``split`` (``None``: all fine-tune), ``"unused"`` for
    the other cells of ``adata``."""
    out = np.full(adata.n_obs, "unused", dtype=object)
    rows = adata.obs_names.get_indexer(labels.index)
    if split is None:
        out[rows] = "fine_tune"
    else:
        out[rows[split.fine_tune]] = "fine_tune"
        out[rows[split.test]] = "test"
    return out.astype(str)


def record_split(adata: ad.AnnData, cell_roles: np.ndarray) -> None:
    """Write the roles of :func:`split_roles` to ``obs[SPLIT_KEY]`` (categorical)."""
    adata.obs[SPLIT_KEY] = pd.Categorical(np.asarray(cell_roles).astype(str))


def fine_tune_cells(adata: ad.AnnData, cell_roles: np.ndarray, labels: pd.Series, label_key: str) -> ad.AnnData:
    """A copy of the fine-tune cells with their checked labels (strings) in ``obs[label_key]``."""
    cells = adata[np.asarray(cell_roles) == "fine_tune"].copy()
    cells.obs[label_key] = labels.reindex(cells.obs_names).to_numpy()
    return cells


def annotation_metrics(y_true: Sequence[str], y_pred: Sequence[str]) -> dict[str, float]:
    """Accuracy and macro-F1 (classes averaged with equal weight)."""
    y_true, y_pred = np.asarray(y_true).astype(str), np.asarray(y_pred).astype(str)
    if y_true.shape != y_pred.shape:
        raise CapeInputError(f"{len(y_true)} true labels but {len(y_pred)} predictions")
    return {"accuracy": float(accuracy_score(y_true, y_pred)),
            "macro_f1": float(f1_score(y_true, y_pred, average="macro", zero_division=0))}


def logistic_regression_pca(adata: ad.AnnData, label_key: str, *, seed: int = 0, n_comps: int = 50,
                            split: AnnotationSplit | None = None) -> dict:
    """Baseline: PCA of the expression, then multinomial logistic regression trained on the fine-tune cells.

    PCA is fit on all cells without labels (the backbones are also pretrained on unlabelled cells); the classifier
    sees only the fine-tune labels. Returns ``{"accuracy", "macro_f1", "n_fine_tune", "n_test", "seconds",
    "test_predictions"}`` (the predicted labels of the test cells, in ``split.test`` order).
    """
    labels = checked_labels(adata, label_key)
    sub = adata[labels.index] if len(labels) < adata.n_obs else adata
    split = split or annotation_split(labels, seed=seed)
    start = time.perf_counter()
    emb = pca_embedding(expression_matrix(sub, keep_sparse=True), n_comps, seed=seed)
    y = labels.to_numpy()
    clf = LogisticRegression(max_iter=5000, random_state=seed).fit(emb[split.fine_tune], y[split.fine_tune])
    predicted = clf.predict(emb[split.test])
    result = annotation_metrics(y[split.test], predicted)
    return result | {"n_fine_tune": len(split.fine_tune), "n_test": len(split.test),
                     "seconds": time.perf_counter() - start, "test_predictions": predicted}
