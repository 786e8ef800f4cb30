"""``grape_m``: multiplicative GRAPE with commuting planes.

Positions act through commuting rotations G_h(x) = B_h·blockdiag(R₂(θ_{h,1}(x)), …, R₂(θ_{h,p}(x)))·B_hᵀ per head h
with plane angles θ_{h,k}(x) = ⟨W_{h,k}, x⟩ linear in the gene's position vector x (Poincaré e, or the scalar
order as a 1-vector), learned frequencies W ∈ R^{H×p×d_pos} and a learned orthogonal basis B_h = exp(S_h − S_hᵀ)
per head (S = 0 at start, so B = I).
Because the generators commute, the logit (B_hᵀq_m)ᵀR(θ_h(x_n) − θ_h(x_m))(B_hᵀk_n) depends on x_n − x_m only
(exact relative law; invariant to translating every position vector). Applied per token as: q ← R(θ_h(x))B_hᵀq
(the final multiplication by B cancels in every logit and is skipped), so no genes×genes tensor is formed.

Initialisation of W follows CAPE's layouts (:func:`cape.encodings.rotary.layout_for`): global plane
c = h·p + k (``"split"``) or c = k (``"shared"``) reads coordinate c mod d_pos with frequency
(π/4)·2^(−⌊c/d_pos⌋). So every coordinate is used when d_pos ≤ H·p, and at initialisation (B = I) GRAPE-M is
exactly CAPE with the same layout when d_pos = H·p (split; the paper's d = D/2) or d_pos = p (shared); a
smaller d_pos gives multi-frequency CAPE (trailing planes reuse the coordinates at halved frequencies).

Special cases: canonical planes (B = I) with W = RoPE spectrum on a scalar order is RoPE; W as above on
Poincaré coordinates is CAPE (GR-4, GR-14).

Models saved before W became per-head stored it as (p, d_pos), shared by every head; loading such a state dict
expands it to (H, p, d_pos), which gives the same output.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from .._errors import CapeInputError
from .base import EncodingContext, PositionalEncoding
from .cape import poincare_coordinates
from .rotary import apply_complex, plane_rotation, rope_frequencies

DEFAULT_SCALE = torch.pi / 4


def cape_frequencies(n_heads: int, n_planes: int, d_pos: int, layout: str) -> Tensor:
    """CAPE's frequencies as a GRAPE-M W (n_heads, n_planes, d_pos): plane c = h·p + k (split) or k (shared)
    reads coordinate c mod d_pos with frequency (π/4)·2^(−⌊c/d_pos⌋)."""
    h = torch.arange(n_heads)[:, None]
    k = torch.arange(n_planes)[None, :]
    c = h * n_planes + k if layout == "split" else k.expand(n_heads, n_planes)
    w = torch.zeros(n_heads, n_planes, d_pos)
    w[h, k, c % d_pos] = DEFAULT_SCALE * 2.0 ** (-(c // d_pos).float())
    return w


class GrapeMEncoding(PositionalEncoding):
    """Commuting multiplicative GRAPE on vector (or scalar) gene positions.

    Options
    -------
    source
        ``"vectors"`` (GenePositions.vectors), ``"order"`` (GenePositions.order as a 1-D position) or
        ``"auto"`` (vectors when present).
    layout
        How the initial W spreads vector coordinates over heads (module docstring): ``"split"``,
        ``"shared"`` or ``"auto"`` (default: shared when d_pos ≤ head_dim/2, else split). Only the
        initialisation depends on it (W is a full per-head matrix); ``source="order"`` is always shared.
    learn_frequencies, learn_basis
        Train W and the per-head basis B (both True by default).
    base
        RoPE base for the scalar-order initialisation.

    Attributes
    ----------
    frequencies
        W, (n_heads, head_dim/2, d_pos) (d_pos = 1 for a scalar order: the RoPE spectrum in every head).
    layout
        The resolved layout of the initialisation, ``"split"`` or ``"shared"``.
    """

    name: ClassVar[str] = "grape_m"
    provides: ClassVar[frozenset[str]] = frozenset({"qk"})
    requires: ClassVar[str | None] = "cape_poincare"
    rotary: ClassVar[bool] = True

    def __init__(self, *, source: str = "auto", layout: str = "auto", learn_frequencies: bool = True,
                 learn_basis: bool = True, base: float = 10_000.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if source not in ("auto", "vectors", "order"):
            raise CapeInputError(f"grape_m source must be 'auto', 'vectors' or 'order', got '{source}'")
        if layout not in ("auto", "split", "shared"):
            raise CapeInputError(f"unknown rotary layout '{layout}' (use 'auto', 'split' or 'shared')")
        if source == "auto":
            has_vectors = self.positions is not None and self.positions.vectors is not None
            source = "vectors" if has_vectors else "order"
        planes = self.head_dim // 2
        if source == "vectors":
            self._need_vectors()
            if self.positions.vectors_are_angles and self.positions.angle_params is None:
                vectors = self.positions.vectors.float() / DEFAULT_SCALE  # unrecorded angles: the paper's c
            else:  # Poincaré coordinates (angles are mapped back through their low band); W re-applies the scale
                vectors = poincare_coordinates(self.positions, self.name)[0].float()
            d_pos = vectors.shape[1]
            if layout == "auto":
                layout = "shared" if d_pos <= planes else "split"
            w = cape_frequencies(self.n_heads, planes, d_pos, layout)
        else:
            if layout == "split":
                raise CapeInputError("grape_m source='order' is a scalar position shared by every head: "
                                     "use layout 'auto' or 'shared'")
            layout = "shared"
            vectors = self._need_order().float()[:, None]
            w = rope_frequencies(planes, base)[None, :, None].repeat(self.n_heads, 1, 1)
        vectors = torch.nan_to_num(vectors, nan=0.0) * self.has_position_table[:, None].float()
        self.register_buffer("position_table", vectors)
        self.source = source
        self.layout = layout
        self.frequencies = torch.nn.Parameter(w, requires_grad=learn_frequencies)
        self.learn_basis = learn_basis
        if learn_basis:
            self.basis_generator = torch.nn.Parameter(torch.zeros(self.n_heads, self.head_dim, self.head_dim))

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # Before W was per head it was stored as (p, d_pos) and shared by every head: expand such a tensor.
        key = prefix + "frequencies"
        old = state_dict.get(key)
        if isinstance(old, Tensor) and old.ndim == 2 and old.shape == self.frequencies.shape[1:]:
            state_dict[key] = old[None].expand(self.frequencies.shape).clone()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def basis(self) -> Tensor | None:
        """(H, head_dim, head_dim) orthogonal basis B = exp(S − Sᵀ), or None when not learned."""
        if not self.learn_basis:
            return None
        s = self.basis_generator
        return torch.linalg.matrix_exp(s - s.transpose(-1, -2))

    def plane_angles(self, positions: Tensor) -> Tensor:
        """(B, L, d_pos) positions → (B, H, L, head_dim/2) plane angles θ_{h,k}(x) = ⟨W_{h,k}, x⟩."""
        return torch.einsum("bld,hkd->bhlk", positions, self.frequencies)

    def _prepare(self, ctx: EncodingContext) -> None:
        x = self.position_table[ctx.gene_ids] * ctx.has_position[..., None].float()
        ctx.state["rotation"] = plane_rotation(self.plane_angles(x))
        ctx.state["basis"] = self.basis()

    def transform_qk(self, q: Tensor, k: Tensor, ctx: EncodingContext, layer: int) -> tuple[Tensor, Tensor]:
        basis = ctx.state["basis"]
        if basis is not None:
            basis = basis.to(q.dtype)[None]  # (1, H, hd, hd): x ← Bᵀx, i.e. row vectors times B
            q, k = q @ basis, k @ basis
        z = ctx.state["rotation"]
        return apply_complex(q, z), apply_complex(k, z)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, source={self.source}, layout={self.layout}"
