"""``tape``: contextualised equivariant positional encoding (TAPE), heads-only variant.

Each token carries a positional state z ∈ ℂ^{H×p} (p = head_dim/2 planes per head; stored as real and
imaginary parts), initialised from CAPE angles, z = exp(i·(π/4)·e_v) (``init="cape"``), or from RoPE on a
scalar order (``init="rope"``). Where the d CAPE coordinates go follows CAPE's ``layout`` (see
:func:`cape.encodings.rotary.layout_for`): ``"shared"`` (d ≤ head_dim/2) gives every head the same phases,
``"split"`` (d ≤ n_heads·head_dim/2; the paper's d = D/2, Supp. F.4 Eq. 26) gives head h the coordinates
h·p … (h+1)·p − 1; ``"auto"`` picks shared when d ≤ head_dim/2. RoPE is always shared. In every layer:

* q/k transform (Eq. 6): plane k of q and k is multiplied by z_k, i.e. the 2×2 block [[Re z, −Im z],
  [Im z, Re z]] — exactly CAPE/RoPE while |z| = 1;
* position attention (Eq. 7): z̃ = A z with the layer's own attention weights A (an SDPA call on the same
  rotated q', k' with values [Re z | Im z], TAPE-6);
* head mixing and position MLP (Eq. 8, minimal variant), per token, ψ = SiLU(Linear(d_model → I)) of the
  block's output x, I = 4H:

  - shared layout: z ← z + W_post z̃ and then z ← z + W₂ diag(ψ(x)) W₁ᵀ z, mixing heads only
    (W_post: H×H, W₁, W₂: H×I);
  - split layout: per head only, z_h ← z_h + w_h z̃_h and then z_h ← z_h + (Σ_i W₂[h,i] W₁[h,i] ψ_i(x)) z_h
    (W_post diagonal, stored as its H diagonal entries w; the MLP's rank-I head mixing restricted to the
    diagonal).

W_post and W₁ start at zero, so at initialisation every layer equals its initialisation (CAPE with the same
layout, or RoPE), and layer 1 always does. The updates are real-linear and act on each plane k separately with
coefficients shared by all planes, so they commute with a phase per plane that is common to every head they
mix: the encoder is permutation-equivariant over genes, equivariant to a global rotation of z, and invariant to
shifting every position (every Poincaré coordinate by the same t) — exactly, to round-off
(tested in ``tests/test_encodings_tape.py``). In the shared layout plane k of every head carries the phase of
coordinate k, so mixing heads is allowed; in the split layout the phase differs per (head, plane), so any
mixing across heads would break the shift invariance — hence the per-head updates there (and the maximal HML×I
mixing is not offered at all).

Tokens without a position start at z = 1; their state then evolves with the context like any other token's.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from .._errors import CapeInputError
from .base import EncodingContext, PositionalEncoding, attention_mask
from .cape import resolve_angles
from .rotary import angles_to_heads, apply_complex, layout_for, rope_frequencies


class TapeEncoding(PositionalEncoding):
    """TAPE with CAPE or RoPE initialisation and heads-only contextualisation.

    Options
    -------
    init
        ``"cape"`` (GenePositions.vectors; default) or ``"rope"`` (GenePositions.order).
    scale, bands, band_top
        The Step III map of the CAPE initialisation, as :class:`~cape.encodings.cape.CapeEncoding` (None: what
        Step III recorded, else π/4 and one band).
    layout
        ``"auto"`` (default), ``"split"`` or ``"shared"``: where the CAPE coordinates go, as in
        :class:`~cape.encodings.cape.CapeEncoding`; the split layout restricts the updates to per-head ones
        (module docstring). ``init="rope"`` is always shared.
    hidden
        Width I of the position MLP (default 4·n_heads).
    base
        RoPE base for ``init="rope"``.

    Attributes
    ----------
    layout
        The resolved layout, ``"split"`` or ``"shared"``.
    head_mix
        W_post per update: (n_layers − 1, H, H) in the shared layout, its diagonal (n_layers − 1, H) in the split
        one.
    """

    name: ClassVar[str] = "tape"
    provides: ClassVar[frozenset[str]] = frozenset({"qk"})
    requires: ClassVar[str | None] = "cape_angles"
    rotary: ClassVar[bool] = True

    def __init__(self, *, init: str = "cape", scale: float | None = None, bands: int | None = None,
                 band_top: float | None = None, layout: str = "auto",
                 hidden: int | None = None, base: float = 10_000.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        planes = self.head_dim // 2
        if init == "cape":
            self._need_vectors()
            angles, self.map_params = resolve_angles(self.positions, self.name, scale=scale, bands=bands,
                                                     band_top=band_top)
            angles = angles.float()
            layout = layout_for(angles.shape[1], self.n_heads, planes, layout)  # raises when d does not fit
            width = planes if layout == "shared" else self.n_heads * planes
            angles = torch.nn.functional.pad(angles, (0, width - angles.shape[1]))
        elif init == "rope":
            if layout == "split":
                raise CapeInputError("tape init='rope' rotates every head by the same scalar order: "
                                     "use layout 'auto' or 'shared'")
            layout_for(1, self.n_heads, planes, layout)  # validates the name
            layout = "shared"
            self.requires = "cape_dag"
            angles = self._need_order().float()[:, None] * rope_frequencies(planes, base)
        else:
            raise CapeInputError(f"tape init must be 'cape' or 'rope', got '{init}'")
        angles = torch.nan_to_num(angles, nan=0.0) * self.has_position_table[:, None].float()
        self.register_buffer("angle_table", angles)  # (V, p) shared, (V, H·p) split
        self.init = init
        self.layout = layout
        width = hidden or 4 * self.n_heads
        n_updates = max(self.n_layers - 1, 0)  # the state after the last layer is never used
        mix_shape = (n_updates, self.n_heads, self.n_heads) if layout == "shared" else (n_updates, self.n_heads)
        self.head_mix = torch.nn.Parameter(torch.zeros(mix_shape))
        self.gate = torch.nn.ModuleList(torch.nn.Linear(self.d_model, width) for _ in range(n_updates))
        self.up = torch.nn.Parameter(torch.zeros(n_updates, self.n_heads, width))
        self.down = torch.nn.Parameter(torch.randn(n_updates, self.n_heads, width) / math.sqrt(width))

    def effective_options(self) -> dict[str, Any]:
        """The Step III map of the CAPE initialisation ({} for ``init="rope"``)."""
        return dict(getattr(self, "map_params", {}))

    # -- state ----------------------------------------------------------------------------------------------
    def _prepare(self, ctx: EncodingContext) -> None:
        angles = self.angle_table[ctx.gene_ids]
        angles = angles * ctx.has_position[..., None].to(angles.dtype)  # (B, L, p or H·p)
        angles = angles_to_heads(angles, self.n_heads, self.head_dim // 2, self.layout)  # (B, 1 or H, L, p)
        b, _, length, p = angles.shape
        ctx.state["re"] = angles.cos().expand(b, self.n_heads, length, p)
        ctx.state["im"] = angles.sin().expand(b, self.n_heads, length, p)

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
        mixed_re, mixed_im = mixed_re.to(dtype), mixed_im.to(dtype)
        mix = self.head_mix[layer]
        psi = torch.nn.functional.silu(self.gate[layer](hidden.to(dtype)))  # (B, L, I)
        up, down = self.up[layer], self.down[layer]
        if self.layout == "shared":
            re = re + torch.einsum("gh,bhlk->bglk", mix, mixed_re)
            im = im + torch.einsum("gh,bhlk->bglk", mix, mixed_im)

            def mlp(z: Tensor) -> Tensor:
                inner = torch.einsum("hi,bhlk->bilk", up, z) * psi.transpose(1, 2)[..., None]
                return torch.einsum("hi,bilk->bhlk", down, inner)

            ctx.state["re"], ctx.state["im"] = re + mlp(re), im + mlp(im)
        else:
            # Per head only: the phase of plane k differs between heads, so mixing heads breaks shift invariance.
            mix = mix[None, :, None, None]
            re, im = re + mix * mixed_re, im + mix * mixed_im
            gain = 1 + (psi @ (down * up).t()).transpose(1, 2)[..., None]  # (B, H, L, 1): 1 + Σ_i W₂W₁ψ_i
            ctx.state["re"], ctx.state["im"] = re * gain, im * gain
        ctx.state.pop("qk", None)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, init={self.init}, layout={self.layout}"
