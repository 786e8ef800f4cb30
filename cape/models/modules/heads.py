"""Task heads on top of a backbone's hidden states (parameter names as scGPT's decoders)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..._errors import CapeInputError


class ExprDecoder(nn.Module):
    """Per-token masked value prediction: MLP ``d → d → d → n_outputs`` with LeakyReLU (scGPT's ``ExprDecoder``).

    ``n_outputs = 1`` regresses the binned value (scGPT); ``n_outputs = n_levels`` gives logits over expression
    levels (scBERT's masked token prediction).
    """

    def __init__(self, d_model: int, n_outputs: int = 1) -> None:
        super().__init__()
        self.n_outputs = int(n_outputs)
        self.fc = nn.Sequential(nn.Linear(d_model, d_model), nn.LeakyReLU(), nn.Linear(d_model, d_model),
                                nn.LeakyReLU(), nn.Linear(d_model, self.n_outputs))

    def forward(self, hidden: Tensor) -> Tensor:
        """``(B, L, d)`` → ``(B, L)`` values or ``(B, L, n_outputs)`` logits."""
        out = self.fc(hidden)
        return out.squeeze(-1) if self.n_outputs == 1 else out


class CellExpressionDecoder(nn.Module):
    """Cell-level reconstruction: the cell embedding → the value of every vocabulary gene, zeros included (scGPT's
    GEPC/MVC idea): MLP ``d → d → n_genes`` with LeakyReLU.

    Masked values alone are predicted from gene identity and neighbouring tokens; asking the ``<cls>`` state for
    the whole expression profile makes it summarise the cell.
    """

    def __init__(self, d_model: int, n_genes: int) -> None:
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(d_model, d_model), nn.LeakyReLU(), nn.Linear(d_model, int(n_genes)))

    def forward(self, cell_embedding: Tensor) -> Tensor:
        """``(B, d)`` → ``(B, n_genes)`` values, one column per vocabulary index."""
        return self.fc(cell_embedding)


class ClsDecoder(nn.Module):
    """Cell classifier on the cell embedding: ``(n_layers − 1) × [Linear, ReLU, LayerNorm]`` + Linear.

    ``d_in`` is the width of the cell embedding (default ``d_model``; ``2 · d_model`` for ``"cls+mean"`` pooling).
    """

    def __init__(self, d_model: int, n_classes: int, n_layers: int = 3, *, d_in: int | None = None) -> None:
        super().__init__()
        self._decoder = nn.ModuleList()
        width = int(d_in or d_model)
        for _ in range(n_layers - 1):
            self._decoder.extend([nn.Linear(width, d_model), nn.ReLU(), nn.LayerNorm(d_model)])
            width = d_model
        self.out_layer = nn.Linear(width, n_classes)

    def forward(self, cell_embedding: Tensor) -> Tensor:
        x = cell_embedding
        for layer in self._decoder:
            x = layer(x)
        return self.out_layer(x)


#: How a cell embedding is read off the hidden states for annotation: the ``<cls>`` state (scGPT), the mean of the
#: gene-token states, or both concatenated (``2 · d_model`` wide).
POOLINGS = ("cls", "mean", "cls+mean")


def pooled_width(d_model: int, pooling: str) -> int:
    """Width of :func:`pool_cells`' output."""
    check_pooling(pooling)
    return 2 * d_model if pooling == "cls+mean" else d_model


def check_pooling(pooling: str) -> str:
    if pooling not in POOLINGS:
        raise CapeInputError(f"unknown pooling {pooling!r}; choose from {', '.join(POOLINGS)}")
    return pooling


def pool_cells(hidden: Tensor, padding_mask: Tensor | None, pooling: str = "cls") -> Tensor:
    """Cell embeddings ``(B, d)`` (or ``(B, 2d)`` for ``"cls+mean"``) from hidden states ``(B, L, d)``.

    The mean runs over the gene tokens only (positions ``1..L-1`` that are not padding); a cell without any gene
    token gets a zero mean.
    """
    check_pooling(pooling)
    cls = hidden[:, 0]
    if pooling == "cls":
        return cls
    genes = hidden[:, 1:]
    keep = (torch.ones(genes.shape[:2], dtype=torch.bool, device=hidden.device) if padding_mask is None
            else ~padding_mask[:, 1:])
    weights = keep.to(genes.dtype).unsqueeze(-1)
    mean = (genes * weights).sum(1) / weights.sum(1).clamp(min=1.0)
    return mean if pooling == "mean" else torch.cat([cls, mean], dim=-1)
