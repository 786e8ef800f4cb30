"""``trainable_relative``: Transformer-XL relative attention (Dai et al. 2019; CAPE Supp. F.3.1, Eq. F.110).

On a scalar gene order o (``GenePositions.order``, e.g. the topological rank), the relative distance of
query gene m and key gene n is r = clip(round(o_n − o_m), −R, R) (R = ``max_distance``). With sinusoidal
vectors p̃_r and, per layer, a learned projection Ŵ (d_model → heads) and global biases u, v per head, the
logit is

    q_mᵀk_n + q_mᵀ Ŵ p̃_r + uᵀk_n + vᵀ Ŵ p̃_r          (F.110; content, position, content bias, position bias)

The first term is the backbone's; the other three form an additive bias (scaled by 1/√head_dim like the
first).
It needs q and k, so :meth:`transform_qk` keeps them (unchanged) for :meth:`attn_bias` of the same layer.
Pairs involving a token without a position get only the content bias uᵀk_n.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from .base import EncodingContext, PositionalEncoding


def sinusoid_table(n: int, width: int, offset: int = 0) -> Tensor:
    """Transformer sinusoids for integer positions offset … offset + n − 1: (n, width)."""
    pos = torch.arange(offset, offset + n, dtype=torch.float64)[:, None]
    i = torch.arange(0, width, 2, dtype=torch.float64)
    angle = pos / (10_000.0 ** (i / width))
    table = torch.zeros(n, width, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)[:, : width // 2]
    return table.float()


class TrainableRelativeEncoding(PositionalEncoding):
    """Transformer-XL relative position terms as a logit bias.

    Options
    -------
    max_distance
        Clip |o_n − o_m| at R (2R + 1 distance buckets).
    """

    name: ClassVar[str] = "trainable_relative"
    provides: ClassVar[frozenset[str]] = frozenset({"bias"})
    requires: ClassVar[str | None] = "cape_dag"

    def __init__(self, *, max_distance: int = 64, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.register_buffer("order_table", torch.nan_to_num(self._need_order().float(), nan=0.0))
        self.max_distance = int(max_distance)
        self.register_buffer("sinusoids", sinusoid_table(2 * self.max_distance + 1, self.d_model,
                                                         offset=-self.max_distance))
        self.position_proj = torch.nn.ModuleList(
            torch.nn.Linear(self.d_model, self.d_model, bias=False) for _ in range(self.n_layers)
        )
        self.content_bias = torch.nn.Parameter(torch.zeros(self.n_layers, self.n_heads, self.head_dim))
        self.position_bias = torch.nn.Parameter(torch.zeros(self.n_layers, self.n_heads, self.head_dim))

    def _prepare(self, ctx: EncodingContext) -> None:
        o = self.order_table[ctx.gene_ids]
        rel = torch.round(o[:, None, :] - o[:, :, None]).clamp(-self.max_distance, self.max_distance)
        ctx.state["bucket"] = (rel + self.max_distance).long()  # (B, L_query, L_key)
        ctx.state["pair_has"] = ctx.has_position[:, :, None] & ctx.has_position[:, None, :]

    def transform_qk(self, q: Tensor, k: Tensor, ctx: EncodingContext, layer: int) -> tuple[Tensor, Tensor]:
        ctx.state["qk"] = (layer, q, k)
        return q, k

    def attn_bias(self, ctx: EncodingContext, layer: int) -> Tensor:
        stored = ctx.state.get("qk")
        if stored is None or stored[0] != layer:
            raise RuntimeError("trainable_relative: call transform_qk before attn_bias in each layer")
        _, q, k = stored
        b, h, length, hd = q.shape
        # Ŵ p̃_r per head: (H, 2R+1, hd)
        rel_keys = self.position_proj[layer](self.sinusoids.to(q.dtype)).view(-1, h, hd).transpose(0, 1)
        u = self.content_bias[layer].to(q.dtype)
        v = self.position_bias[layer].to(q.dtype)
        pos_scores = torch.einsum("bhld,hrd->bhlr", q, rel_keys) + torch.einsum("hd,hrd->hr", v, rel_keys)[
            None, :, None, :
        ]  # (B, H, L, 2R+1): per query and bucket, O(L·R) not O(L²) before the gather
        index = ctx.state["bucket"][:, None].expand(b, h, length, length)
        position = torch.gather(pos_scores, 3, index)
        position = position.masked_fill(~ctx.state["pair_has"][:, None], 0.0)
        content = torch.einsum("hd,bhld->bhl", u, k)[:, :, None, :]
        return (position + content) / math.sqrt(hd)
