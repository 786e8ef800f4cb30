"""``hope``: hyperbolic rotary positional encoding (HoPE), on a scalar gene order.

Per plane i of a head, with the light-cone coordinates u = (x₁ + x₂)/√2 and w = (x₁ − x₂)/√2 and the offset
Δ = p_query − p_key, the published form (Eq. 10–11) has the logit

    e^{−θ'Δ} Σ_i q_iᵀ B(θ_i Δ) k_i = e^{−θ'Δ} Σ_i [e^{θ_iΔ} u_q u_k + e^{−θ_iΔ} w_q w_k],   B = Lorentz boost.

It decays only for Δ ≥ 0 and grows without bound for Δ < 0, i.e. it is a causal (decoder) encoding.

* ``variant="symmetric"`` (default): the bidirectional form e^{−θ'|Δ|} Σ_i q_iᵀB(θ_iΔ)k_i — even part a
  symmetric decay, odd part (sinh) keeps the direction (upstream vs downstream). Computed exactly by two
  light-cone matmuls (one per sign of Δ) joined with ``torch.where``, then softmax: an explicit genes×genes
  logit path (``provides = {"attention"}``; not usable with linear attention). |logit| ≤ e^{−|Δ|(θ'−max
  θ)}‖q‖‖k‖/√head_dim.
* ``variant="causal"``: the published per-token transform (Algorithm 1) as a q/k transform plus a causal
  mask along the order (keys with p_key > p_query are masked), as published for decoders.

Positions are the order normalised to [0, 1] (so exponents stay bounded: (θ' + max θ)·max|p| ≤ 40 keeps fp32
finite, note §1.2e); θ_i = θ_max·base^(−2i/head_dim) fixed, θ' = θ_max + softplus(ρ_h) > max θ per head
(learned).
Pairs involving a token without a position get the plain logit qᵀk (the θ = θ' = 0 limit) in the symmetric
variant; in the causal variant such tokens sit at the end of the order (p = 1).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from .._errors import CapeInputError
from .base import EncodingContext, PositionalEncoding, attention_mask
from .rotary import rope_frequencies

_EXP_LIMIT = 40.0  # largest exponent allowed in the per-token factors (fp32 overflows at ~88)


def boost_planes(x: Tensor, eta: Tensor) -> Tensor:
    """Apply B(η) = [[cosh η, sinh η], [sinh η, cosh η]] to each adjacent plane of x (η: (..., p))."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = torch.cosh(eta), torch.sinh(eta)
    return torch.stack((c * x0 + s * x1, s * x0 + c * x1), dim=-1).flatten(-2)


def light_cone(x: Tensor) -> tuple[Tensor, Tensor]:
    """(u, w) = ((x₁ + x₂)/√2, (x₁ − x₂)/√2) per plane: the eigenbasis of every boost B(η) (e^{±η})."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return (x0 + x1) / math.sqrt(2.0), (x0 - x1) / math.sqrt(2.0)


def hope_symmetric_logits(q: Tensor, k: Tensor, p_q: Tensor, p_k: Tensor, theta: Tensor,
                          damping: Tensor) -> Tensor:
    """Symmetric HoPE logits e^{−θ'|Δ|} Σ_i q_iᵀB(θ_iΔ)k_i / √d (Δ = p_q − p_k) by two light-cone matmuls.

    q: (B, H, Lq, d), k: (B, H, Lk, d); p_q: (B, Lq), p_k: (B, Lk); theta: (d/2,); damping θ': (H,).
    """
    uq, wq = light_cone(q)
    uk, wk = light_cone(k)
    r1 = (damping[:, None] - theta[None, :])[None, :, None, :]  # (1, H, 1, p): θ' − θ_i > 0
    r2 = (damping[:, None] + theta[None, :])[None, :, None, :]  # θ' + θ_i
    pq = p_q[:, None, :, None]
    pk = p_k[:, None, :, None]
    # Δ ≥ 0:  e^{−r1Δ} u u + e^{−r2Δ} w w ;  Δ < 0:  e^{r2Δ} u u + e^{r1Δ} w w
    plus_q = torch.cat((uq * torch.exp(-r1 * pq), wq * torch.exp(-r2 * pq)), dim=-1)
    plus_k = torch.cat((uk * torch.exp(r1 * pk), wk * torch.exp(r2 * pk)), dim=-1)
    minus_q = torch.cat((uq * torch.exp(r2 * pq), wq * torch.exp(r1 * pq)), dim=-1)
    minus_k = torch.cat((uk * torch.exp(-r2 * pk), wk * torch.exp(-r1 * pk)), dim=-1)
    delta = p_q[:, None, :, None] - p_k[:, None, None, :]
    logits = torch.where(delta >= 0, plus_q @ plus_k.transpose(-1, -2), minus_q @ minus_k.transpose(-1, -2))
    return logits / math.sqrt(q.shape[-1])


class HopeEncoding(PositionalEncoding):
    """HoPE on a scalar gene order (``GenePositions.order``), normalised to [0, 1].

    Options
    -------
    variant
        ``"symmetric"`` (bidirectional; default) or ``"causal"`` (published form + causal mask along the
        order).
    theta_max
        Largest boost rate θ_max (plane rates θ_i = θ_max·base^(−2i/head_dim)).
    damping_init
        Initial θ' − θ_max (> 0).
    base
        Spectrum base (10,000).
    """

    name: ClassVar[str] = "hope"
    provides: ClassVar[frozenset[str]] = frozenset({"attention"})
    requires: ClassVar[str | None] = "cape_dag"
    rotary: ClassVar[bool] = True

    def __init__(self, *, variant: str = "symmetric", theta_max: float = 4.0, damping_init: float = 1.0,
                 base: float = 10_000.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if variant not in ("symmetric", "causal"):
            raise CapeInputError(f"hope variant must be 'symmetric' or 'causal', got '{variant}'")
        if theta_max < 0 or damping_init <= 0:
            raise CapeInputError("hope needs theta_max ≥ 0 and damping_init > 0")
        if 2 * theta_max + damping_init > _EXP_LIMIT:
            raise CapeInputError(f"hope: 2·theta_max + damping_init must be ≤ {_EXP_LIMIT} (fp32 overflow)")
        self.variant = variant
        self.provides = frozenset({"attention"}) if variant == "symmetric" else frozenset({"qk", "bias"})
        order = torch.nan_to_num(self._need_order().double(), nan=0.0)
        has = self.has_position_table
        lo = order[has].min() if has.any() else torch.tensor(0.0, dtype=torch.float64)
        hi = order[has].max() if has.any() else torch.tensor(1.0, dtype=torch.float64)
        span = torch.clamp(hi - lo, min=1e-12)
        self.register_buffer("order_table", ((order - lo) / span * has).float())
        theta = theta_max * rope_frequencies(self.head_dim // 2, base)
        self.register_buffer("theta", theta, persistent=False)
        # θ' = θ_max + softplus(ρ): always above every plane rate, so the envelope decays.
        rho = math.log(math.expm1(damping_init))
        self.rho = torch.nn.Parameter(torch.full((self.n_heads,), rho))
        self.theta_max = float(theta_max)

    def damping(self) -> Tensor:
        """θ' per head, clamped so that (θ' + θ_max) ≤ 40 for positions in [0, 1]."""
        damping = self.theta_max + torch.nn.functional.softplus(self.rho)
        return torch.clamp(damping, max=_EXP_LIMIT - self.theta_max)

    def _prepare(self, ctx: EncodingContext) -> None:
        p = self.order_table[ctx.gene_ids]
        # symmetric: no-position pairs use the plain logit; causal: no-position tokens sit at the end (p = 1),
        # so <cls> sees every gene with a decaying weight and no gene attends to it.
        fill = 0.0 if self.variant == "symmetric" else 1.0
        ctx.state["p"] = torch.where(ctx.has_position, p, torch.full_like(p, fill))
        ctx.state["pair_has"] = ctx.has_position[:, :, None] & ctx.has_position[:, None, :]

    def logits(self, q: Tensor, k: Tensor, ctx: EncodingContext, layer: int = 0) -> Tensor:
        """Explicit logits (B, H, L, L), scaled by 1/√head_dim (padding not masked)."""
        if self.variant == "causal":
            return super().logits(q, k, ctx, layer)
        dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype  # exp() needs range
        q, k = q.to(dtype), k.to(dtype)
        p = ctx.state["p"].to(dtype)
        hope = hope_symmetric_logits(q, k, p, p, self.theta.to(dtype), self.damping().to(dtype))
        plain = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return torch.where(ctx.state["pair_has"][:, None], hope, plain)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, ctx: EncodingContext, layer: int, *,
                  dropout_p: float = 0.0) -> Tensor:
        if self.variant == "causal":
            return super().attention(q, k, v, ctx, layer, dropout_p=dropout_p)
        logits = self.logits(q, k, ctx, layer)
        mask = attention_mask(ctx.key_padding_mask, None, logits.dtype)
        if mask is not None:
            logits = logits + mask
        weights = torch.softmax(logits, dim=-1)
        if dropout_p > 0 and self.training:
            weights = torch.nn.functional.dropout(weights, p=dropout_p)
        return (weights @ v.to(weights.dtype)).to(v.dtype)

    # -- causal (published) variant ------------------------------------------------------------------------
    def transform_qk(self, q: Tensor, k: Tensor, ctx: EncodingContext, layer: int) -> tuple[Tensor, Tensor]:
        if self.variant != "causal":
            raise CapeInputError("symmetric HoPE has no per-token q/k transform; call attention() instead")
        p = ctx.state["p"].to(q.dtype)[:, None, :, None]  # (B, 1, L, 1)
        eta = p * self.theta.to(q.dtype)
        damp = self.damping().to(q.dtype)[None, :, None, None]
        q = torch.exp(-damp * p) * boost_planes(q, eta)
        k = torch.exp(damp * p) * boost_planes(k, -eta)
        return q, k

    def attn_bias(self, ctx: EncodingContext, layer: int) -> Tensor | None:
        if self.variant != "causal":
            return None
        p = ctx.state["p"]
        later = p[:, None, :] > p[:, :, None]  # key after query in the order
        bias = torch.zeros(later.shape, dtype=torch.float32, device=p.device)
        bias = bias.masked_fill(later, float("-inf"))
        return bias[:, None]
