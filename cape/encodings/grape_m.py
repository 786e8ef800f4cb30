"""``grape_m``: multiplicative GRAPE with commuting planes (research note §4.1, §4.5).

Positions act through commuting rotations G(x) = B·blockdiag(R₂(θ_1(x)), …, R₂(θ_p(x)))·Bᵀ with plane angles
θ_k(x) = ⟨W_k, x⟩ linear in the gene's position vector x (Poincaré e, or the scalar order as a 1-vector),
learned frequencies W ∈ R^{H×p×d_pos} (one p×d_pos block per head) and a learned orthogonal basis
B = exp(S − Sᵀ) per head (S = 0 at start, so B = I).
Because the generators commute, the logit (Bᵀq_m)ᵀR(θ(x_n) − θ(x_m))(Bᵀk_n) depends on x_n − x_m only (exact
relative law; invariant to translating every position vector). Applied per token as: q ← R(θ(x))Bᵀq (the final
multiplication by B cancels in every logit and is skipped), so no genes×genes tensor is formed.

Special cases: canonical planes (B = I) with W = RoPE spectrum on a scalar order is RoPE; W = (π/4)·I on
Poincaré coordinates is CAPE (GR-4, GR-14), in either of CAPE's layouts: with d_pos ≤ p every head starts from the
same coordinates (shared), with d_pos > p head h's planes start on coordinates h·p … (split, the paper's
d = D/2), so every coordinate is used.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from .._errors import CapeInputError
from .base import EncodingContext, PositionalEncoding
from .rotary import apply_complex, plane_rotation, rope_frequencies

DEFAULT_SCALE = torch.pi / 4


class GrapeMEncoding(PositionalEncoding):
    """Commuting multiplicative GRAPE on vector (or scalar) gene positions.

    Options
    -------
    source
        ``"vectors"`` (GenePositions.vectors), ``"order"`` (GenePositions.order as a 1-D position) or
        ``"auto"`` (vectors when present).
    learn_frequencies, learn_basis
        Train W and the per-head basis B (both True by default).
    base
        RoPE base for the scalar-order initialisation, and for the extra frequencies when planes outnumber
        coordinates.

    Initialisation of W: for vector positions, global plane c (c = k for plane k of every head when
    d_pos ≤ p = head_dim/2; c = h·p + k for plane k of head h when d_pos > p) uses coordinate c mod d_pos with
    frequency (π/4)·2^(−⌊c/d_pos⌋) — exactly CAPE when d_pos = p (shared) or d_pos = H·p (split), multi-frequency
    CAPE in between or below; for a scalar order, W = RoPE spectrum in every head (exactly RoPE).
    """

    name: ClassVar[str] = "grape_m"
    provides: ClassVar[frozenset[str]] = frozenset({"qk"})
    requires: ClassVar[str | None] = "cape_poincare"
    rotary: ClassVar[bool] = True

    def __init__(self, *, source: str = "auto", learn_frequencies: bool = True, learn_basis: bool = True,
                 base: float = 10_000.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if source not in ("auto", "vectors", "order"):
            raise CapeInputError(f"grape_m source must be 'auto', 'vectors' or 'order', got '{source}'")
        if source == "auto":
            has_vectors = self.positions is not None and self.positions.vectors is not None
            source = "vectors" if has_vectors else "order"
        planes = self.head_dim // 2
        if source == "vectors":
            vectors = self._need_vectors().float()
            if self.positions.vectors_are_angles:
                vectors = vectors / DEFAULT_SCALE  # back to Poincaré coordinates; W re-applies the scale
            d_pos = vectors.shape[1]
            k = torch.arange(planes)
            plane = k[None].expand(self.n_heads, planes)  # shared: every head starts on the same coordinates
            if d_pos > planes:  # split: head h's planes continue where head h−1's stopped
                plane = plane + planes * torch.arange(self.n_heads)[:, None]
            w = torch.zeros(self.n_heads, planes, d_pos)
            w.scatter_(2, (plane % d_pos)[..., None], (DEFAULT_SCALE * 2.0 ** (-(plane // d_pos).float()))[..., None])
        else:
            vectors = self._need_order().float()[:, None]
            w = rope_frequencies(planes, base)[None, :, None].repeat(self.n_heads, 1, 1)
        vectors = torch.nan_to_num(vectors, nan=0.0) * self.has_position_table[:, None].float()
        self.register_buffer("position_table", vectors)
        self.source = source
        self.frequencies = torch.nn.Parameter(w, requires_grad=learn_frequencies)
        self.learn_basis = learn_basis
        if learn_basis:
            self.basis_generator = torch.nn.Parameter(torch.zeros(self.n_heads, self.head_dim, self.head_dim))

    def basis(self) -> Tensor | None:
        """(H, head_dim, head_dim) orthogonal basis B = exp(S − Sᵀ), or None when not learned."""
        if not self.learn_basis:
            return None
        s = self.basis_generator
        return torch.linalg.matrix_exp(s - s.transpose(-1, -2))

    def plane_angles(self, positions: Tensor) -> Tensor:
        """(B, L, d_pos) positions → (B, H, L, head_dim/2) plane angles θ_h(x) = W_h x."""
        return torch.einsum("bld,hpd->bhlp", positions, self.frequencies)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "frequencies"
        if key in state_dict and state_dict[key].ndim == 2:
            # Saved before frequencies were per head: one (p, d_pos) block shared by every head.
            state_dict[key] = state_dict[key][None].repeat(self.n_heads, 1, 1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _prepare(self, ctx: EncodingContext) -> None:
        x = self.position_table[ctx.gene_ids] * ctx.has_position[..., None].float()
        angles = self.plane_angles(x)  # (B, H, L, p)
        ctx.state["rotation"] = plane_rotation(angles)
        ctx.state["basis"] = self.basis()

    def transform_qk(self, q: Tensor, k: Tensor, ctx: EncodingContext, layer: int) -> tuple[Tensor, Tensor]:
        basis = ctx.state["basis"]
        if basis is not None:
            basis = basis.to(q.dtype)[None]  # (1, H, hd, hd): x ← Bᵀx, i.e. row vectors times B
            q, k = q @ basis, k @ basis
        z = ctx.state["rotation"]
        return apply_complex(q, z), apply_complex(k, z)
