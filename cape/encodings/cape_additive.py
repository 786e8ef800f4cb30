"""``cape_additive``: the paper's CAPE-w/o-rotary ablation — a learned projection of the Poincaré
coordinates e added to the input embedding (an absolute encoding carrying the same causal geometry, without
the relative law).
Tokens without a position get a zero embedding."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from .base import EncodingContext, PositionalEncoding


class CapeAdditiveEncoding(PositionalEncoding):
    """x ← x + W e_v + b for genes with a position (W: d → d_model, learned)."""

    name: ClassVar[str] = "cape_additive"
    provides: ClassVar[frozenset[str]] = frozenset({"input"})
    requires: ClassVar[str | None] = "cape_poincare"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        vectors = torch.nan_to_num(self._need_vectors().float(), nan=0.0)
        self.register_buffer("vector_table", vectors)
        self.projection = torch.nn.Linear(vectors.shape[1], self.d_model)

    def input_embedding(self, gene_ids: Tensor, ctx: EncodingContext) -> Tensor:
        emb = self.projection(self.vector_table[gene_ids])
        return emb * ctx.has_position[..., None].to(emb.dtype)
