"""Step III on AnnData: rotary angles φ_v = c·e_v of every gene (CAPE Sec. 3.5, Eq. 26).

Fields set: ``varm["cape_angles"]`` = c · ``varm["cape_poincare"]``, ``uns["cape"]["rotary_encoding"]``."""

from __future__ import annotations

import math

import anndata as ad
import numpy as np
import torch

from .._errors import CapeInputError
from ..encodings.cape import cape_angles
from ._uns import record_step


def rotary_encoding(adata: ad.AnnData, scale: float = math.pi / 4, *, key: str = "cape_poincare",
                    key_added: str = "cape_angles", copy: bool = False) -> ad.AnnData | None:
    """Rotary angles φ_v = c·e_v of every gene (CAPE Step III, Sec. 3.5, Eq. 26).

    Parameters
    ----------
    adata
        AnnData with Poincaré positions in ``varm[key]`` (from :func:`hyperbolic_embedding`).
    scale
        c; the paper's π/4 keeps every angle within ±π/4 since ‖e‖ < 1.
    key, key_added
        Input and output ``varm`` keys.
    copy
        Return a modified copy instead of writing into ``adata``.

    Reads
    -----
    ``varm["cape_poincare"]`` (``key``).

    Writes
    ------
    ``varm["cape_angles"]`` (``key_added``), ``uns["cape"]["rotary_encoding"]``.

    Returns
    -------
    ``None`` or the copy. Sets ``varm[key_added]`` (n_vars, d) and ``uns["cape"]["rotary_encoding"]``.
    """

    if not (isinstance(scale, int | float) and math.isfinite(scale) and scale > 0):
        raise CapeInputError(f"scale must be a positive finite number, got {scale!r}")
    if key not in adata.varm:
        raise CapeInputError(f"varm[{key!r}] not found: embed the causal graph first with `cape embed` "
                             "(cape.tl.hyperbolic_embedding)")
    adata = adata.copy() if copy else adata
    positions = np.asarray(adata.varm[key], dtype=np.float64)
    angles = cape_angles(torch.from_numpy(positions), float(scale)).numpy()
    adata.varm[key_added] = angles
    record_step(adata, "rotary_encoding", {"params": {"scale": float(scale), "key": key, "key_added": key_added},
                                       "max_abs_angle": float(np.abs(angles).max()) if angles.size else 0.0})
    return adata if copy else None
