"""Step III on AnnData: rotary angles φ_v = c·e_v of every gene (CAPE Sec. 3.5, Eq. 26), in one or several bands.

Fields set: ``varm["cape_angles"]`` (c · ``varm["cape_poincare"]``, or B bands of it),
``uns["cape"]["rotary_encoding"]``."""

from __future__ import annotations

import logging
import math

import anndata as ad
import numpy as np
import torch

from .._errors import CapeInputError
from ..encodings.cape import DEFAULT_BAND_TOP, band_frequencies, cape_angles
from ._uns import record_step, step_key

logger = logging.getLogger("cape")

#: ``varm`` key of Step III's angles (``key_added`` of :func:`rotary_encoding`).
ANGLES_KEY = "cape_angles"


def rotary_encoding(adata: ad.AnnData, scale: float = math.pi / 4, *, bands: int = 1,
                    band_top: float = DEFAULT_BAND_TOP, key: str = "cape_poincare", key_added: str = ANGLES_KEY,
                    copy: bool = False) -> ad.AnnData | None:
    """Rotary angles of every gene (CAPE Step III, Sec. 3.5, Eq. 26): φ_v = c·e_v, or B bands of it.

    Parameters
    ----------
    adata
        AnnData with Poincaré positions in ``varm[key]`` (from :func:`hyperbolic_embedding`).
    scale
        c; the paper's π/4 keeps every angle of the low band within ±π/4 since ‖e‖ < 1.
    bands
        B: each coordinate drives B rotation planes at multipliers ω_b = band_top^(b/(B−1)) (band-major columns,
        :func:`cape.encodings.cape.cape_angles`). 1 (default) is the paper's map; a model then needs d·B planes.
    band_top
        Multiplier of the highest band (64; unused with one band).
    key, key_added
        Input and output ``varm`` keys.
    copy
        Return a modified copy instead of writing into ``adata``.

    Reads
    -----
    ``varm["cape_poincare"]`` (``key``).

    Writes
    ------
    ``varm["cape_angles"]`` (``key_added``), ``uns["cape"]["rotary_encoding"]`` (``uns["cape"][key_added]`` for
    another than the default key; ``params``: scale, bands,
    band_top, keys; the band multipliers; the largest angle of the low band and of all bands). Encodings read
    the params with the angles, so a model applies exactly this map unless it is given another.

    Returns
    -------
    ``None`` or the copy. Sets ``varm[key_added]`` (n_vars, d·B) and its record.
    """

    if not (isinstance(scale, int | float) and math.isfinite(scale) and scale > 0):
        raise CapeInputError(f"scale must be a positive finite number, got {scale!r}")
    omega = band_frequencies(bands, band_top)  # validates bands and band_top
    if key not in adata.varm:
        raise CapeInputError(f"varm[{key!r}] not found: embed the causal graph first with `cape embed` "
                             "(cape.tl.hyperbolic_embedding)")
    adata = adata.copy() if copy else adata
    positions = np.asarray(adata.varm[key], dtype=np.float64)
    angles = cape_angles(torch.from_numpy(positions), float(scale), bands, float(band_top)).numpy()
    adata.varm[key_added] = angles
    low = angles[:, : positions.shape[1]]
    record_step(adata, "rotary_encoding", {
        "params": {"scale": float(scale), "bands": int(bands), "band_top": float(band_top), "key": key,
                   "key_added": key_added},
        "band_multipliers": omega.numpy(),
        "max_abs_angle_low_band": float(np.abs(low).max()) if low.size else 0.0,
        "max_abs_angle": float(np.abs(angles).max()) if angles.size else 0.0},
        key=step_key("rotary_encoding", key_added, ANGLES_KEY))
    logger.info("Step III: %d angles per gene for %d genes (scale %.3g, %d band(s)), largest |angle| %.3g → "
                "varm[%r]", angles.shape[1], angles.shape[0], scale, bands,
                float(np.abs(angles).max()) if angles.size else 0.0, key_added)
    return adata if copy else None
