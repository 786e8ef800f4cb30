"""``grape_a``: additive GRAPE / ALiBi-style logit bias on a gene distance.

The bias of query gene i and key gene j in head h is −β_h·m_ij, with ALiBi's slopes β_h = 2^(−8h/H) (h = 1..H;
learnable when ``learn_slopes``) and the distance m_ij one of

* ``"order"``: |o_i − o_j| on the scalar gene order (symmetric ALiBi; on positions 0..L−1 this is ALiBi
  exactly);
* ``"poincare"``: the Poincaré distance d_P(e_i, e_j) = arcosh(1 + 2‖e_i − e_j‖²/((1 − ‖e_i‖²)(1 − ‖e_j‖²)));
* ``"graph"``: ``GenePositions.graph_distance`` (e.g. shortest-path length on the DAG's skeleton).

``signed=True`` (order only) gives GRAPE-A's exact-relative form +β_h·(o_j − o_i) — ALiBi of a causal decoder.
In a bidirectional encoder (no mask) the row-constant part −β_h·o_i cancels in the softmax, so it collapses
to a per-key bias β_h·o_j: genes late in the order simply get more attention from everyone.
Prefer the unsigned distances here. Pairs involving a token without a position get zero bias. The bias is a
genes×genes tensor: SDPA backbones only (Performer refuses it).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from .._errors import CapeInputError
from ..hyperbolic.poincare import pairwise_poincare_distance
from .base import EncodingContext, PositionalEncoding


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi head slopes 2^(−8h/H), h = 1..H (Press et al.)."""
    h = torch.arange(1, n_heads + 1, dtype=torch.float64)
    return (2.0 ** (-8.0 * h / n_heads)).float()


def alibi_lift(q: Tensor, k: Tensor, p_q: Tensor, p_k: Tensor, slope: Tensor) -> tuple[Tensor, Tensor]:
    """GRAPE-A's homogeneous lift (Eq. 4.7): q̂ = G_add(i)[q; 1; 0], k̂ = G_add(j)^{−ᵀ}[k; 0; 1] with
    G_add(n) = I + nA, A = −β e_{d+2}e_{d+1}ᵀ (A² = 0), so that q̂ᵀk̂ = qᵀk + β(p_k − p_q) exactly.

    q: (B, H, L, d), p_q: (B, L), slope β: (H,). Returns (B, H, L, d + 2) tensors.
    """
    beta = slope[None, :, None]
    ones_q = torch.ones_like(q[..., :1])
    q_hat = torch.cat((q, ones_q, (-beta * p_q[:, None, :])[..., None]), dim=-1)
    k_hat = torch.cat((k, (beta * p_k[:, None, :])[..., None], torch.ones_like(k[..., :1])), dim=-1)
    return q_hat, k_hat


class GrapeAEncoding(PositionalEncoding):
    """ALiBi-style additive bias −β_h·m_ij on a gene distance.

    Options
    -------
    distance
        ``"order"`` (default), ``"poincare"`` or ``"graph"``.
    signed
        Exact-relative signed form β_h·(o_j − o_i) (``distance="order"`` only; see module docstring).
    learn_slopes
        Train log β_h (initialised at the ALiBi slopes).
    """

    name: ClassVar[str] = "grape_a"
    provides: ClassVar[frozenset[str]] = frozenset({"bias"})
    requires: ClassVar[str | None] = "cape_dag"

    def __init__(self, *, distance: str = "order", signed: bool = False, learn_slopes: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if distance not in ("order", "poincare", "graph"):
            raise CapeInputError(f"grape_a distance must be 'order', 'poincare' or 'graph', got '{distance}'")
        if signed and distance != "order":
            raise CapeInputError("grape_a signed=True needs distance='order' (a signed offset)")
        self.distance, self.signed = distance, signed
        if distance == "order":
            self.register_buffer("order_table", torch.nan_to_num(self._need_order().float(), nan=0.0))
        elif distance == "poincare":
            self.requires = "cape_poincare"
            self.register_buffer("vector_table", torch.nan_to_num(self._need_vectors().double(), nan=0.0))
        else:
            if self.positions is None or self.positions.graph_distance is None:
                raise self._missing("cape_dag")
            self.register_buffer("distance_table", self.positions.graph_distance.float())
        self.log_slopes = torch.nn.Parameter(alibi_slopes(self.n_heads).log(), requires_grad=learn_slopes)

    def slopes(self) -> Tensor:
        return self.log_slopes.exp()

    def pair_offsets(self, ctx: EncodingContext) -> Tensor:
        """(B, L, L) offsets m_ij (signed o_j − o_i, or a distance); 0 where a token has no position."""
        ids = ctx.gene_ids
        if self.distance == "order":
            o = self.order_table[ids]
            m = o[:, None, :] - o[:, :, None]
            if not self.signed:
                m = m.abs()
        elif self.distance == "poincare":
            e = self.vector_table[ids]
            m = pairwise_poincare_distance(e, e).float()
        else:
            m = self.distance_table[ids[:, :, None], ids[:, None, :]]
        pair_has = ctx.has_position[:, :, None] & ctx.has_position[:, None, :]
        return torch.where(pair_has, m, torch.zeros((), dtype=m.dtype, device=m.device))

    def _prepare(self, ctx: EncodingContext) -> None:
        ctx.state["offsets"] = self.pair_offsets(ctx)

    def attn_bias(self, ctx: EncodingContext, layer: int) -> Tensor:
        m = ctx.state["offsets"][:, None]  # (B, 1, L, L)
        beta = self.slopes()[None, :, None, None]
        return beta * m if self.signed else -beta * m
