"""The record of a step in ``uns["cape"][step]``: parameters, seed, timings and library versions, stored so that
h5ad can write them."""

from __future__ import annotations

import platform

import anndata as ad
import geoopt
import torch

from .. import __version__


def record_step(adata: ad.AnnData, step: str, entry: dict) -> None:
    cape_uns = adata.uns.setdefault("cape", {})
    entry = h5ad_safe({**entry, "versions": {"cape": __version__, "torch": str(torch.__version__),
                                   "geoopt": str(getattr(geoopt, "__version__", "unknown")),
                                   "python": platform.python_version()}})
    cape_uns[step] = entry


def h5ad_safe(obj):
    """h5ad cannot store None: write it as the string "none" (e.g. ``negatives=None`` = exact loss)."""
    if isinstance(obj, dict):
        return {str(k): h5ad_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [h5ad_safe(v) for v in obj]
    return "none" if obj is None else obj
