"""Training objectives: a backbone plus a head as one ``nn.Module`` whose forward returns the loss (masked value
prediction) or the logits (cell classification), so that DDP wraps a single module."""

from __future__ import annotations

from torch import Tensor, nn

from .heads import ClsDecoder, ExprDecoder, pool_cells


class MaskedValueTask(nn.Module):
    """Backbone + expression decoder → mean over cells of the per-cell masked loss (MSE or cross-entropy).

    Averaging per cell first makes the loss of a batch the mean of its cells' losses, so DDP's gradient average
    over equal shards equals single-process training on the union.
    """

    def __init__(self, backbone: nn.Module, head: ExprDecoder, value_scale: float = 1.0) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.value_scale = float(value_scale)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        hidden = self.backbone(batch["gene_ids"], batch["masked_values"], batch["padding_mask"])
        pred = self.head(hidden)
        mask = batch["mask"]
        target = batch["values"]
        if pred.ndim == 2:
            # Regress bins rescaled to [0, 1] (scGPT regresses 0..50 directly, which with gradient clipping
            # takes many steps just to reach the mean).
            target = target / self.value_scale
        if pred.ndim == 3:  # level logits
            per_token = nn.functional.cross_entropy(
                pred.float().flatten(0, 1), target.round().long().clamp(0, pred.shape[-1] - 1).flatten(),
                reduction="none").view_as(target)
        else:
            per_token = (pred.float() - target) ** 2
        per_cell = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return per_cell.mean()


class ClassifierTask(nn.Module):
    """Backbone + pooled cell embedding + classification head → class logits."""

    def __init__(self, backbone: nn.Module, head: ClsDecoder, pooling: str = "cls") -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.pooling = pooling

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        hidden = self.backbone(batch["gene_ids"], batch["values"], batch["padding_mask"])
        return self.head(pool_cells(hidden, batch["padding_mask"], self.pooling))
