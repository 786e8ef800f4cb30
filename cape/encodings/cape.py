"""``cape``: causality-aware rotary encoding (CAPE Step III, Sec. 3.5, Eq. 24–26; input mode Supp. F.108).

Gene v has Poincaré coordinates e_v ∈ R^d (Step II); its rotary angles are φ_v = c·e_v with c = π/4. Queries
and keys (never values) of gene v are rotated plane by plane by R(φ_v), so the logit of query gene m and key
gene n is q_mᵀ R(φ_n − φ_m) k_n (Eq. 25): it depends on e only through e_n − e_m, hence it is unchanged when
every e is shifted by the same vector (a Euclidean translation — not a hyperbolic isometry). Tokens without
a position (``<cls>``, padding, genes outside the graph) get angle 0, the identity.

**Bands.** The paper's map bounds every angle by c = π/4, and Step II puts genes on a thin shell, so nearby genes
get nearly equal angles and a model that has no other gene identity cannot tell them apart (issue 33). With
``bands=B`` each coordinate drives B planes at geometric multipliers ω_b = top^(b/(B−1)) (ω_0 = 1, as RoPE's
spectrum, :func:`band_frequencies`): band 0 is the paper's map, within ±π/4, on which Props 4.1/4.2 hold; the
higher bands wrap around. The table is band-major (d columns per band), so with ``layout="split"`` and d = p the
low band fills whole heads. ``bands=1`` is exactly the paper's map; ``cape_paper`` always uses it.

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
from .base import EncodingContext, GenePositions, PositionalEncoding
from .rotary import angles_to_heads, apply_complex, apply_rotary, layout_for, plane_rotation, rotate_embedding

DEFAULT_SCALE = math.pi / 4
#: Multiplier of the highest band (ω_{B−1}) of a multi-band map: at ×16–×64 the genes of a 200-gene true DAG
#: became distinguishable in ``replace`` mode (issue 33), while ×1 (the paper's) left annotation at chance.
DEFAULT_BAND_TOP = 64.0


def band_frequencies(bands: int = 1, top: float = DEFAULT_BAND_TOP, dtype: torch.dtype = torch.float64) -> Tensor:
    """Band multipliers ω_b = top^(b/(B−1)), b = 0..B−1: a geometric spectrum like RoPE's, rising from ω_0 = 1.

    ω_0 = 1 is the paper's map itself (the low band); one band is ``tensor([1.])`` whatever ``top``.
    """
    if isinstance(bands, bool) or not isinstance(bands, int) or bands < 1:
        raise CapeInputError(f"bands must be a positive integer, got {bands!r}")
    if not (isinstance(top, int | float) and math.isfinite(top) and top >= 1):
        raise CapeInputError(f"band_top must be a finite number ≥ 1, got {top!r}")
    b = torch.arange(bands, dtype=torch.float64)
    return (float(top) ** (b / max(bands - 1, 1))).to(dtype)


def cape_angles(e: Tensor, scale: float = DEFAULT_SCALE, bands: int = 1, top: float = DEFAULT_BAND_TOP) -> Tensor:
    """Rotary angles from Poincaré coordinates e (..., d) → (..., d·B).

    Band-major: columns b·d … (b+1)·d − 1 hold φ^(b) = ω_b·c·e (:func:`band_frequencies`). Band 0 is the paper's
    φ = c·e (Eq. 26), within ±c since ‖e‖ < 1, so Props 4.1/4.2 hold on its planes; the higher bands wrap around
    and make nearby genes distinguishable. ``bands=1`` is exactly c·e.
    """
    if not (isinstance(scale, int | float) and math.isfinite(scale) and scale > 0):
        raise CapeInputError(f"scale must be a positive finite number, got {scale!r}")
    if bands == 1:
        return e * scale
    omega = band_frequencies(bands, top, dtype=e.dtype if e.is_floating_point() else torch.float64)
    return (e[..., None, :] * (scale * omega)[:, None]).flatten(-2)


def low_band(angles: Tensor, bands: int = 1) -> Tensor:
    """The band-0 columns (the paper's φ = c·e) of a band-major angle table (..., d·B) → (..., d)."""
    width = angles.shape[-1]
    if width % bands:
        raise CapeInputError(f"{width} angle columns are not {bands} bands of equal width")
    return angles[..., : width // bands]


#: Step III options an encoding can take, with their defaults when nothing was recorded.
MAP_DEFAULTS: dict[str, Any] = {"scale": DEFAULT_SCALE, "bands": 1, "band_top": DEFAULT_BAND_TOP}


def poincare_coordinates(positions: GenePositions, encoding: str = "cape") -> tuple[Tensor, dict[str, Any] | None]:
    """Poincaré coordinates e (V, d) of ``positions``, and the Step III record the angles came with (or None).

    Vectors that are angles are turned back into e through their low band (ω_0 = 1): e = φ^(0)/c with the
    recorded c. Angles without a record (:attr:`GenePositions.angle_params` None) cannot be: CapeInputError.
    """
    vectors = positions.vectors
    if not positions.vectors_are_angles:
        return vectors, None
    record = positions.angle_params
    if record is None:
        raise CapeInputError(
            f"encoding '{encoding}': scale/bands cannot act on angles without their Step III record "
            "(uns['cape']['rotary_encoding']); pass Poincaré coordinates or re-run `cape encode`"
        )
    return low_band(vectors, int(record["bands"])) / float(record["scale"]), record


def resolve_angles(positions: GenePositions, encoding: str = "cape", **options: Any) -> tuple[Tensor, dict[str, Any]]:
    """The angle table (V, d·B) an encoding uses, and the map that made it (``scale``, ``bands``, ``band_top``).

    Options left None take Step III's recorded value when the positions are angles (so ``cape encode --scale``
    acts), else :data:`MAP_DEFAULTS`; options given explicitly always act: angles that arrived with a record are
    recomputed from their e (:func:`poincare_coordinates`), angles without one are refused with one line. So the
    scale and bands are effective whichever way the positions arrive.
    """
    unknown = set(options) - set(MAP_DEFAULTS)
    if unknown:
        raise CapeInputError(f"unknown Step III option(s) {', '.join(sorted(unknown))}")
    given = {k: v for k, v in options.items() if v is not None}
    if positions.vectors_are_angles and positions.angle_params is None:
        if given:
            poincare_coordinates(positions, encoding)  # raises the one-line error
        return positions.vectors, {"scale": None, "bands": None, "band_top": None, "from": "angles as given"}
    e, record = poincare_coordinates(positions, encoding)
    base = MAP_DEFAULTS if record is None else {**MAP_DEFAULTS, **record}
    params = {k: base[k] if given.get(k) is None else given[k] for k in MAP_DEFAULTS}
    if record is not None and all(params[k] == record[k] for k in MAP_DEFAULTS):
        return positions.vectors, {**params, "from": "Step III angles"}
    angles = cape_angles(e.double(), float(params["scale"]), params["bands"], float(params["band_top"]))
    return angles.to(positions.vectors.dtype), {**params, "from": "Step III angles, re-mapped" if record
                                                 else "Poincaré coordinates"}


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
    scale, bands, band_top
        The Step III map (:func:`cape_angles`): c (π/4), the number of bands B and the highest band's multiplier.
        None takes what Step III recorded with the angles (``uns['cape']['rotary_encoding']``), else π/4, 1 band,
        ×64. A value given here always acts, also on angles made by ``cape encode`` (re-mapped from their e).
        With B bands each Poincaré coordinate drives B rotation planes: d·B must fit the planes (``layout``).
    mode
        ``"attention"`` (rotate q, k per head; default), ``"input"`` (rotate the token embedding, F.108) or
        ``"both"``.
    layout
        ``"auto"``, ``"split"`` or ``"shared"`` (q/k rotation).

    Attributes
    ----------
    map_params
        The map in effect: ``scale``, ``bands``, ``band_top`` and ``from`` (where the angles came from).
    """

    name: ClassVar[str] = "cape"
    provides: ClassVar[frozenset[str]] = frozenset({"qk"})
    requires: ClassVar[str | None] = "cape_angles"
    rotary: ClassVar[bool] = True
    replace_options: ClassVar[dict[str, Any]] = {"mode": "both"}

    def __init__(self, *, scale: float | None = None, bands: int | None = None, band_top: float | None = None,
                 mode: str = "attention", layout: str = "auto", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if mode not in ("attention", "input", "both"):
            raise CapeInputError(f"{self.name} mode must be 'attention', 'input' or 'both', got '{mode}'")
        self._need_vectors()
        angles, self.map_params = resolve_angles(self.positions, self.name, scale=scale, bands=bands,
                                                 band_top=band_top)
        angles = torch.where(self.has_position_table[:, None], angles, torch.zeros((), dtype=angles.dtype))
        angles = torch.nan_to_num(angles.float(), nan=0.0)
        self.register_buffer("angle_table", angles)
        self.mode = mode
        self.provides = frozenset({"input": {"input"}, "attention": {"qk"}, "both": {"input", "qk"}}[mode])
        self.scale = self.map_params["scale"]
        if mode != "attention" and angles.shape[1] > self.d_model // 2:
            raise CapeInputError(
                f"{self.name} {mode} mode: {angles.shape[1]} angle coordinates exceed d_model/2 = "
                f"{self.d_model // 2}{self._bands_hint()}"
            )
        try:
            self.rotation = None if mode == "input" else CapeRotation(self.n_heads, self.head_dim, angles.shape[1],
                                                                       layout)
        except CapeInputError as err:
            raise CapeInputError(f"{err}{self._bands_hint()}") from None

    def _bands_hint(self) -> str:
        bands = self.map_params.get("bands") or 1
        return f" ({bands} bands × d coordinates; use fewer bands or embed with a smaller dim)" if bands > 1 else ""

    def effective_options(self) -> dict[str, Any]:
        """The Step III map this encoding applies (recorded with the model in ``uns['cape']['model']``)."""
        return dict(self.map_params)

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
        p = self.map_params
        scale = "as given" if p["scale"] is None else f"{p['scale']:.4g}"
        return f"{super().extra_repr()}, mode={self.mode}, scale={scale}, bands={p['bands']}{layout}"


class CapePaperEncoding(CapeEncoding):
    """The paper's single-band CAPE map φ = c·e (Eq. 26), whatever bands Step III wrote.

    Multi-band angles from ``cape encode --bands B`` are reduced to their low band (the same e, ω_0 = 1), so this
    is the encoding behind the paper's figures. Angles without a Step III record are used as given. Options as
    :class:`CapeEncoding` without ``bands``/``band_top``.
    """

    name: ClassVar[str] = "cape_paper"

    def __init__(self, *, scale: float | None = None, mode: str = "attention", layout: str = "auto",
                 **kwargs: Any) -> None:
        for option in ("bands", "band_top"):
            if option in kwargs:
                raise CapeInputError(f"encoding 'cape_paper' is the single-band map: option '{option}' is "
                                     "not taken (use encoding 'cape')")
        positions = kwargs.get("positions")
        # Angles without a Step III record are taken as they are (their bands cannot be known); else one band.
        unrecorded = positions is not None and positions.vectors_are_angles and positions.angle_params is None
        super().__init__(scale=scale, bands=None if unrecorded else 1, mode=mode, layout=layout, **kwargs)
