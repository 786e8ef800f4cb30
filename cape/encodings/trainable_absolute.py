"""``trainable_absolute``: a learned embedding per gene token added to the input (scGPT's default gene
encoder).

Every vocabulary entry (``<cls>`` included) has its own vector; padded positions get zero. Needs no positions.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from .base import EncodingContext, PositionalEncoding


class TrainableAbsoluteEncoding(PositionalEncoding):
    """x ← x + E[gene_id], E ∈ R^{V × d_model} learned (init N(0, init_std²))."""

    name: ClassVar[str] = "trainable_absolute"
    provides: ClassVar[frozenset[str]] = frozenset({"input"})

    def __init__(self, *, init_std: float = 0.02, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.embedding = torch.nn.Embedding(self.vocab_size, self.d_model)
        torch.nn.init.normal_(self.embedding.weight, std=init_std)

    def input_embedding(self, gene_ids: Tensor, ctx: EncodingContext) -> Tensor:
        emb = self.embedding(gene_ids)
        if ctx.key_padding_mask is not None:
            emb = emb.masked_fill(ctx.key_padding_mask[..., None], 0.0)
        return emb
