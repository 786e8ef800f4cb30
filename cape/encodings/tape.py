"""``tape``: contextualised equivariant positional encoding (TAPE; research note §3), heads-only variant.

Each token carries a positional state z ∈ ℂ^{H×p} (p = head_dim/2 planes per head; stored as real and
imaginary parts), initialised from CAPE angles, z = exp(i·(π/4)·e_v) identical across heads
(``init="cape"``), or from
RoPE on
a scalar order (``init="rope"``). In every layer:

* q/k transform (Eq. 6): plane k of q and k is multiplied by z_k, i.e. the 2×2 block [[Re z, −Im z],
  [Im z, Re z]] — exactly CAPE/RoPE while |z| = 1;
* position attention (Eq. 7): z̃ = A z with the layer's own attention weights A (an SDPA call on the same
  rotated q', k' with values [Re z | Im z], TAPE-6);
* head mixing and position MLP (Eq. 8, minimal variant): z ← z + W_post z̃ and then
  z ← z + W₂ diag(ψ(x)) W₁ᵀ z per token, mixing heads only (W_post: H×H, W₁, W₂: H×I, I = 4H,
  ψ = SiLU(Linear(d_model → I)) of the block's output x).

W_post and W₁ start at zero, so at initialisation every layer equals its initialisation (CAPE or RoPE), and
layer 1 always does. The updates are real-linear with coefficients shared by all planes, so they commute
with a common phase per plane: the encoder is permutation-equivariant over genes, equivariant to a global
rotation of z, and invariant to shifting every position (every Poincaré coordinate by the same t) — exactly,
to round-off (research note TAPE-1..3; the maximal HML×I mixing would break the shift invariance, so it is
not offered).

Layouts (``layout=``, as CAPE's, :func:`cape.encodings.rotary.layout_for`): ``shared`` — every head starts from
the same d ≤ head_dim/2 coordinates; ``split`` — the paper's d = D/2 (CAPE Supp. F.4), head h starts from
coordinates h·p … (h+1)·p − 1. In the split layout a common shift of the positions turns each (head, plane) by
its own phase, so mixing heads would break the shift invariance: there the updates act per head (head_mix keeps
its diagonal, and the position MLP becomes z_h ← z_h + (Σ_i W₂[h,i] W₁[h,i] ψ_i(x)) z_h), which keeps all three
properties exactly. ``auto`` (default) picks shared when d ≤ head_dim/2, else split. Tokens without a position
start at z = 1; their state then evolves with the context like any other token's.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from .._errors import CapeInputError
from .base import EncodingContext, PositionalEncoding, attention_mask
from .cape import DEFAULT_SCALE
from .rotary import angles_to_heads, apply_complex, layout_for, rope_frequencies


class TapeEncoding(PositionalEncoding):
    """TAPE with CAPE or RoPE initialisation and heads-only contextualisation.

    Options
    -------
    init
        ``"cape"`` (GenePositions.vectors; default) or ``"rope"`` (GenePositions.order).
    scale
        c for the CAPE initialisation (π/4).
    hidden
        Width I of the position MLP (default 4·n_heads).
    base
        RoPE base for ``init="rope"``.
    layout
        ``"auto"``, ``"split"`` or ``"shared"`` for ``init="cape"`` (module docstring); ``init="rope"`` is shared.
    """

    name: ClassVar[str] = "tape"
    provides: ClassVar[frozenset[str]] = frozenset({"qk"})
    requires: ClassVar[str | None] = "cape_angles"
    rotary: ClassVar[bool] = True

    def __init__(self, *, init: str = "cape", scale: float = DEFAULT_SCALE, hidden: int | None = None,
                 base: float = 10_000.0, layout: str = "auto", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        planes = self.head_dim // 2
        if init == "cape":
            vectors = self._need_vectors().float()
            angles = vectors if self.positions.vectors_are_angles else vectors * scale
            self.layout = layout_for(angles.shape[1], self.n_heads, planes, layout)  # raises when d does not fit
            width = planes if self.layout == "shared" else self.n_heads * planes
            angles = torch.nn.functional.pad(angles, (0, width - angles.shape[1]))
        elif init == "rope":
            self.requires = "cape_dag"
            self.layout = "shared"
            angles = self._need_order().float()[:, None] * rope_frequencies(planes, base)
        else:
            raise CapeInputError(f"tape init must be 'cape' or 'rope', got '{init}'")
        angles = torch.nan_to_num(angles, nan=0.0) * self.has_position_table[:, None].float()
        self.register_buffer("angle_table", angles)
        self.init = init
        width = hidden or 4 * self.n_heads
        n_updates = max(self.n_layers - 1, 0)  # the state after the last layer is never used
        self.head_mix = torch.nn.Parameter(torch.zeros(n_updates, self.n_heads, self.n_heads))
        self.gate = torch.nn.ModuleList(torch.nn.Linear(self.d_model, width) for _ in range(n_updates))
        self.up = torch.nn.Parameter(torch.zeros(n_updates, self.n_heads, width))
        self.down = torch.nn.Parameter(torch.randn(n_updates, self.n_heads, width) / math.sqrt(width))

    # -- state ----------------------------------------------------------------------------------------------
    def _prepare(self, ctx: EncodingContext) -> None:
        angles = self.angle_table[ctx.gene_ids]
        angles = angles * ctx.has_position[..., None].to(angles.dtype)  # (B, L, p) shared, (B, L, H·p) split
        heads = angles_to_heads(angles, self.n_heads, self.head_dim // 2, self.layout)  # (B, H or 1, L, p)
        shape = (angles.shape[0], self.n_heads, angles.shape[1], self.head_dim // 2)
        ctx.state["re"] = heads.cos().expand(shape)
        ctx.state["im"] = heads.sin().expand(shape)

    def state(self, ctx: EncodingContext) -> tuple[Tensor, Tensor]:
        """Current positional state (Re z, Im z), each (B, H, L, head_dim/2)."""
        return ctx.state["re"], ctx.state["im"]

    # -- hooks ----------------------------------------------------------------------------------------------
    def transform_qk(self, q: Tensor, k: Tensor, ctx: EncodingContext, layer: int) -> tuple[Tensor, Tensor]:
        z = torch.complex(ctx.state["re"], ctx.state["im"])
        q, k = apply_complex(q, z), apply_complex(k, z)
        ctx.state["qk"] = (layer, q, k)
        return q, k

    def _position_attention(self, ctx: EncodingContext, layer: int) -> tuple[Tensor, Tensor]:
        """z̃ = A z with the layer's attention weights A = softmax(q'k'ᵀ/√d) (same q', k' and mask).

        A second SDPA call rather than values [v | Re z | Im z] in one call: value and query widths then match,
        which keeps the fused (flash / memory-efficient) kernels usable; the result is the same (TAPE-6).
        """
        stored = ctx.state.get("qk")
        if stored is None or stored[0] != layer:
            raise RuntimeError("tape: transform_qk must run in each layer before after_layer")
        _, q, k = stored
        re, im = ctx.state["re"].to(q.dtype), ctx.state["im"].to(q.dtype)
        mask = attention_mask(ctx.key_padding_mask, None, q.dtype)
        values = torch.cat((re, im), dim=-1)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, values, attn_mask=mask)
        return out[..., : re.shape[-1]], out[..., re.shape[-1]:]

    def after_layer(self, ctx: EncodingContext, hidden: Tensor, layer: int) -> None:
        if layer >= self.n_layers - 1:
            return
        mixed_re, mixed_im = self._position_attention(ctx, layer)
        dtype = self.head_mix.dtype  # the state stays in the parameters' precision (fp32 under autocast)
        re, im = ctx.state["re"].to(dtype), ctx.state["im"].to(dtype)
        mix = self.head_mix[layer]
        per_head = self.layout == "split"  # heads carry different phases: only per-head updates keep invariance
        if per_head:
            mix = torch.diag_embed(torch.diagonal(mix))
        re = re + torch.einsum("gh,bhlk->bglk", mix, mixed_re.to(dtype))
        im = im + torch.einsum("gh,bhlk->bglk", mix, mixed_im.to(dtype))
        psi = torch.nn.functional.silu(self.gate[layer](hidden.to(dtype)))  # (B, L, I)
        up, down = self.up[layer], self.down[layer]

        def mlp(z: Tensor) -> Tensor:
            if per_head:
                return torch.einsum("hi,bli->bhl", up * down, psi)[..., None] * z
            inner = torch.einsum("hi,bhlk->bilk", up, z) * psi.transpose(1, 2)[..., None]
            return torch.einsum("hi,bilk->bhlk", down, inner)

        ctx.state["re"], ctx.state["im"] = re + mlp(re), im + mlp(im)
        ctx.state.pop("qk", None)
