"""``rope``: rotary position encoding (RoPE) on a scalar gene order.

The order is either per gene — ``GenePositions.order``, e.g. the DAG's topological rank with PageRank
tie-break (:func:`cape.encodings.ordering.topological_positions`) — or per cell: the token's expression rank
(``order="expression"``, needs ``values=`` in :meth:`begin`). Plane i of every head is rotated by p·θ_i with
RoPE's spectrum θ_i = base^(−2i/head_dim); the logit depends only on p_n − p_m. Tokens without a position:
angle 0.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from .._errors import CapeInputError
from .base import POSITION_SOURCES, EncodingContext, PositionalEncoding
from .ordering import expression_rank_positions
from .rotary import apply_complex, plane_rotation, rope_frequencies


class RotaryOrderEncoding(PositionalEncoding):
    """RoPE with scalar gene positions.

    Options
    -------
    order
        ``"positions"`` (GenePositions.order; default) or ``"expression"`` (per-cell expression rank).
    base
        RoPE base (10,000).
    """

    name: ClassVar[str] = "rope"
    provides: ClassVar[frozenset[str]] = frozenset({"qk"})
    requires: ClassVar[str | None] = "cape_dag"
    rotary: ClassVar[bool] = True

    def __init__(self, *, order: str = "positions", base: float = 10_000.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if order not in ("positions", "expression"):
            raise CapeInputError(f"rope order must be 'positions' or 'expression', got '{order}'")
        self.order = order
        self.register_buffer("frequencies", rope_frequencies(self.head_dim // 2, base), persistent=False)
        if order == "positions":
            table = torch.nan_to_num(self._need_order().float(), nan=0.0)
            self.register_buffer("order_table", table)

    def token_positions(self, ctx: EncodingContext) -> Tensor:
        """(B, L) scalar positions of the batch's tokens (0 where no position)."""
        if self.order == "expression":
            if ctx.values is None:
                raise CapeInputError(f"encoding 'rope' with order='expression': {POSITION_SOURCES['values']}")
            pos = expression_rank_positions(ctx.values, ctx.key_padding_mask)
            has = torch.ones_like(ctx.gene_ids, dtype=torch.bool)
            if ctx.key_padding_mask is not None:
                has = has & ~ctx.key_padding_mask
            ctx.has_position = has
        else:
            pos = self.order_table[ctx.gene_ids]
        return pos * ctx.has_position.to(pos.dtype)

    def _prepare(self, ctx: EncodingContext) -> None:
        angles = self.token_positions(ctx)[:, None, :, None] * self.frequencies  # (B, 1, L, p)
        ctx.state["rotation"] = plane_rotation(angles)

    def transform_qk(self, q: Tensor, k: Tensor, ctx: EncodingContext, layer: int) -> tuple[Tensor, Tensor]:
        z = ctx.state["rotation"]
        return apply_complex(q, z), apply_complex(k, z)
