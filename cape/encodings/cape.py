"""``cape``: causality-aware rotary encoding (CAPE Step III, Sec. 3.5, Eq. 24–26; input mode Supp. F.108).

Gene v has Poincaré coordinates e_v ∈ R^d (Step II); its rotary angles are φ_v = c·e_v with c = π/4. Queries
and keys (never values) of gene v are rotated plane by plane by R(φ_v), so the logit of query gene m and key
gene n is q_mᵀ R(φ_n − φ_m) k_n (Eq. 25): it depends on e only through e_n − e_m, hence it is unchanged when
every e is shifted by the same vector (a Euclidean translation — not a hyperbolic isometry). Tokens without
a position (``<cls>``, padding, genes outside the graph) get angle 0, the identity.

Where the d angle coordinates go (see :func:`cape.encodings.rotary.layout_for`):

* ``layout="split"``: coordinates split across heads, d = n_heads·head_dim/2 = D/2 (head h uses coordinates
  h·p … (h+1)·p − 1, p = head_dim/2). This is the paper's setting (Supp. F.4, Eq. 26: one coordinate per
  rotation plane of the D-wide q/k) and the default pipeline's: Step II embeds in 32 dimensions, the default
  model has D = 64 (4 heads × 8 planes);
* ``layout="shared"``: every head uses the same coordinates, d = head_dim/2;
* ``layout="auto"`` (default): shared when d ≤ head_dim/2, else split; a smaller d than the layout holds
  leaves the trailing planes unrotated (exactly as if those coordinates were 0), more raises CapeInputError.

TAPE (``init="cape"``) and GRAPE-M start from these same layouts (:mod:`cape.encodings.tape`,
:mod:`cape.encodings.grape_m`): at initialisation each equals CAPE with the same layout.

``mode="input"`` (F.108) rotates the token embedding itself, x ← R(φ_v)x with d ≤ d_model/2, instead of q
and k; ``mode="both"`` does both. ``both`` is what a backbone uses when CAPE *replaces* its gene-identity embedding
(``integration="replace"``, Supp. F.2: the fusion F(v, φ) = R(φ)v of F.108 takes the place of scBERT's
v + gene2vec and scGPT's v + gene table, and Sec. 3.5 rotates q and k in every layer).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from .._errors import CapeInputError
from .base import EncodingContext, PositionalEncoding
from .rotary import angles_to_heads, apply_complex, apply_rotary, layout_for, plane_rotation, rotate_embedding

DEFAULT_SCALE = math.pi / 4


def cape_angles(e: Tensor, scale: float = DEFAULT_SCALE) -> Tensor:
    """Rotary angles φ = c·e from Poincaré coordinates (any shape; c = π/4 by default)."""
    return e * scale


class CapeRotation(torch.nn.Module):
    """The CAPE rotation as a stand-alone module: ``forward(x, angles)`` rotates q or k per head.

    Parameters
    ----------
    n_heads, head_dim
        Shape of the rotated vectors x: (B, n_heads, L, head_dim), head_dim even.
    dim
        Number of angle coordinates d per gene.
    layout
        ``"auto"``, ``"split"`` or ``"shared"`` (module docstring).
    """

    def __init__(self, n_heads: int, head_dim: int, dim: int, layout: str = "auto") -> None:
        super().__init__()
        if head_dim % 2:
            raise CapeInputError(f"CAPE rotates pairs of coordinates: head_dim = {head_dim} must be even")
        self.n_heads, self.head_dim, self.dim = n_heads, head_dim, dim
        self.layout = layout_for(dim, n_heads, head_dim // 2, layout)

    def head_angles(self, angles: Tensor) -> Tensor:
        """(B, L, d) per-token angles → (B, H or 1, L, head_dim/2) plane angles."""
        return angles_to_heads(angles, self.n_heads, self.head_dim // 2, self.layout)

    def forward(self, x: Tensor, angles: Tensor) -> Tensor:
        """Rotate x (B, H, L, head_dim) by per-token angles (B, L, d)."""
        return apply_rotary(x, self.head_angles(angles))


class CapeEncoding(PositionalEncoding):
    """CAPE rotary encoding on per-gene vectors (``GenePositions.vectors``: Poincaré e, or angles φ).

    Options
    -------
    scale
        c in φ = c·e (π/4); ignored when ``positions.vectors_are_angles``.
    mode
        ``"attention"`` (rotate q, k per head; default), ``"input"`` (rotate the token embedding, F.108) or
        ``"both"``.
    layout
        ``"auto"``, ``"split"`` or ``"shared"`` (q/k rotation).
    """

    name: ClassVar[str] = "cape"
    provides: ClassVar[frozenset[str]] = frozenset({"qk"})
    requires: ClassVar[str | None] = "cape_angles"
    rotary: ClassVar[bool] = True
    replace_options: ClassVar[dict[str, Any]] = {"mode": "both"}

    def __init__(self, *, scale: float = DEFAULT_SCALE, mode: str = "attention", layout: str = "auto",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if mode not in ("attention", "input", "both"):
            raise CapeInputError(f"cape mode must be 'attention', 'input' or 'both', got '{mode}'")
        vectors = self._need_vectors()
        angles = vectors if self.positions.vectors_are_angles else cape_angles(vectors, scale)
        angles = torch.where(self.has_position_table[:, None], angles, torch.zeros((), dtype=angles.dtype))
        angles = torch.nan_to_num(angles.float(), nan=0.0)
        self.register_buffer("angle_table", angles)
        self.mode = mode
        self.provides = frozenset({"input": {"input"}, "attention": {"qk"}, "both": {"input", "qk"}}[mode])
        self.scale = float(scale)
        if mode != "attention" and angles.shape[1] > self.d_model // 2:
            raise CapeInputError(
                f"cape {mode} mode: {angles.shape[1]} angle coordinates exceed d_model/2 = {self.d_model // 2}"
            )
        self.rotation = None if mode == "input" else CapeRotation(self.n_heads, self.head_dim, angles.shape[1],
                                                                   layout)

    def token_angles(self, ctx: EncodingContext) -> Tensor:
        """(B, L, d) angles of the batch's tokens (0 where no position)."""
        angles = self.angle_table[ctx.gene_ids]
        return angles * ctx.has_position[..., None].to(angles.dtype)

    def _prepare(self, ctx: EncodingContext) -> None:
        angles = self.token_angles(ctx)
        if self.mode != "attention":
            ctx.state["angles"] = angles
        if self.rotation is not None:
            ctx.state["rotation"] = plane_rotation(self.rotation.head_angles(angles))  # once per forward

    def apply_input(self, x: Tensor, ctx: EncodingContext) -> Tensor:
        if self.mode == "attention":
            return x
        return rotate_embedding(x, ctx.state["angles"].to(x.dtype))

    def transform_qk(self, q: Tensor, k: Tensor, ctx: EncodingContext, layer: int) -> tuple[Tensor, Tensor]:
        if self.mode == "input":
            return q, k
        z = ctx.state["rotation"]
        return apply_complex(q, z), apply_complex(k, z)

    def extra_repr(self) -> str:
        layout = "" if self.rotation is None else f", layout={self.rotation.layout}"
        return f"{super().extra_repr()}, mode={self.mode}, scale={self.scale:.4g}{layout}"
