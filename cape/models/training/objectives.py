"""Training objectives of :class:`~cape.models.CellTransformer`: torch modules that turn a batch into a loss.

* :class:`PretrainingTask` — pretraining: predict the hidden values of masked gene tokens and, from the ``<cls>``
  state, the cell's whole expression profile;
* :class:`ClassifierTask` and :func:`classifier_objective` — annotation: cell-type logits, their (class-weighted)
  cross-entropy and the validation scores that pick the best epoch;
* :func:`balanced_class_weights` — scikit-learn's ``"balanced"`` class weights.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from ..._errors import CapeInputError
from ..modules.heads import CellExpressionDecoder, ClsDecoder, ExprDecoder, pool_cells

#: ``class_weight=`` choices of :meth:`~cape.models.CellTransformer.train`.
CLASS_WEIGHTS = (None, "balanced")
#: ``early_stopping_metric=`` choices of :meth:`~cape.models.CellTransformer.train`.
MONITORS = ("val_loss", "val_accuracy", "val_balanced_accuracy")

LossFn = Callable[[nn.Module, dict[str, Tensor]], Tensor]
ScoreFn = Callable[[nn.Module, dict[str, Tensor]], dict[str, float]]


class PretrainingTask(nn.Module):
    """Backbone + expression decoders → the pretraining loss of a batch.

    * masked values: mean over cells of the per-cell loss (MSE or cross-entropy) on the hidden values;
    * cell expression (with ``cell_head``): the ``<cls>`` state predicts every vocabulary gene's value, zeros
      included (``batch["cell_values"]`` at the vocabulary indices ``target_ids``), MSE averaged per cell, added
      with weight ``cell_weight``.

    Both values are regressed in units of ``value_scale`` (bins rescaled to [0, 1]: scGPT regresses 0..50 directly,
    which with gradient clipping takes many steps just to reach the mean). Averaging per cell first makes the loss
    of a batch the mean of its cells' losses, so DDP's gradient average over equal shards equals single-process
    training on the union.
    """

    def __init__(self, backbone: nn.Module, head: ExprDecoder, value_scale: float = 1.0, *,
                 cell_head: CellExpressionDecoder | None = None, target_ids: np.ndarray | None = None,
                 cell_weight: float = 1.0) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.value_scale = float(value_scale)
        self.cell_head = cell_head
        self.cell_weight = float(cell_weight)
        if cell_head is not None:
            if target_ids is None:
                raise ValueError("a cell head needs the vocabulary indices of its targets")
            self.register_buffer("target_ids", torch.as_tensor(np.asarray(target_ids), dtype=torch.long),
                                 persistent=False)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        hidden = self.backbone(batch["gene_ids"], batch["masked_values"], batch["padding_mask"])
        pred = self.head(hidden)
        mask = batch["mask"]
        target = batch["values"]
        if pred.ndim == 2:
            target = target / self.value_scale
        if pred.ndim == 3:  # level logits
            per_token = nn.functional.cross_entropy(
                pred.float().flatten(0, 1), target.round().long().clamp(0, pred.shape[-1] - 1).flatten(),
                reduction="none").view_as(target)
        else:
            per_token = (pred.float() - target) ** 2
        loss = ((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()
        if self.cell_head is not None:
            profile = self.cell_head(hidden[:, 0]).float()[:, self.target_ids]
            cell = ((profile - batch["cell_values"] / self.value_scale) ** 2).mean(dim=1).mean()
            loss = loss + self.cell_weight * cell
        return loss


def pretraining_loss(task: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """The loss of a :class:`PretrainingTask` (possibly DDP-wrapped) is its output."""
    return task(batch)


class ClassifierTask(nn.Module):
    """Backbone + annotation head → class logits of the pooled cell embedding."""

    def __init__(self, backbone: nn.Module, head: ClsDecoder, pooling: str = "cls") -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.pooling = pooling

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        hidden = self.backbone(batch["gene_ids"], batch["values"], batch["padding_mask"])
        return self.head(pool_cells(hidden, batch["padding_mask"], self.pooling))


def encode_labels(labels: pd.Series, label_key: str) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Positions of the labelled cells, the sorted classes (as strings) and every cell's class code (-1: none)."""
    keep = np.flatnonzero(labels.notna().to_numpy())
    if keep.size < 2:
        raise CapeInputError(f"obs['{label_key}'] has fewer than two labelled cells")
    classes = sorted(pd.unique(labels.iloc[keep].astype(str)))
    if len(classes) < 2:
        raise CapeInputError(f"obs['{label_key}'] has a single class ({classes[0]!r}); need at least two")
    codes = np.full(len(labels), -1, dtype=np.int64)
    codes[keep] = pd.Categorical(labels.iloc[keep].astype(str), categories=classes).codes
    return keep, classes, codes


def check_classifier_options(class_weight: str | None, early_stopping_metric: str, label_smoothing: float) -> None:
    """Refuse unknown ``class_weight`` / ``early_stopping_metric`` values and a label smoothing outside [0, 1)."""
    if class_weight not in CLASS_WEIGHTS:
        raise CapeInputError(f"class_weight must be None or 'balanced', got {class_weight!r}")
    if early_stopping_metric not in MONITORS:
        raise CapeInputError(f"early_stopping_metric must be one of {', '.join(MONITORS)}, "
                             f"got {early_stopping_metric!r}")
    if not 0.0 <= label_smoothing < 1.0:
        raise CapeInputError(f"label_smoothing must be in [0, 1), got {label_smoothing}")


def balanced_class_weights(codes: np.ndarray, n_classes: int) -> np.ndarray:
    """``n / (k · n_c)`` per class over the classes present (scikit-learn's "balanced"); absent classes get 1."""
    counts = np.bincount(np.asarray(codes, dtype=np.int64), minlength=n_classes).astype(np.float64)
    present = counts > 0
    weights = np.ones(n_classes)
    weights[present] = counts.sum() / (present.sum() * counts[present])
    return weights


def classifier_objective(weight: Tensor | None, label_smoothing: float, val_codes: np.ndarray, n_classes: int,
                         device: torch.device) -> tuple[LossFn, ScoreFn]:
    """Training loss and validation scores of a :class:`ClassifierTask`.

    The loss is the cross-entropy with class ``weight`` and ``label_smoothing``. The scores are batch sums: the
    loss as trained, plain accuracy, and per-class hits for the balanced accuracy over the validation cells
    (whose classes are ``val_codes``).
    """

    def loss_fn(m, batch):
        return nn.functional.cross_entropy(m(batch).float(), batch["label"], weight=weight,
                                           label_smoothing=label_smoothing)

    def score_fn(m, batch):
        logits = m(batch).float()
        y = batch["label"]
        loss = nn.functional.cross_entropy(logits, y, weight=weight, label_smoothing=label_smoothing)
        hits = (logits.argmax(-1) == y).float()
        return {"val_loss": float(loss) * y.shape[0], "val_accuracy": float(hits.sum()),
                "val_balanced_accuracy": float((hits / val_class_counts[y]).sum()) * n_val / n_val_classes}

    val_class_counts = torch.as_tensor(np.bincount(val_codes, minlength=n_classes).clip(min=1),
                                       dtype=torch.float32, device=device)
    n_val, n_val_classes = len(val_codes), max(len(np.unique(val_codes)), 1)
    return loss_fn, score_fn
