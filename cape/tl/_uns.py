"""The record of a step in ``uns["cape"][step]``: parameters, seed, timings and library versions, stored so that
h5ad can write them."""

from __future__ import annotations

import platform
from collections.abc import Mapping

import anndata as ad
import geoopt
import torch

from .. import __version__

#: ``varp`` key of Step I's graph (``key_added`` of :func:`cape.tl.causal_graph`).
DAG_KEY = "cape_dag"


def step_key(step: str, key_added: str, default: str) -> str:
    """Where a step's record goes in ``uns["cape"]``: ``step`` for its default ``key_added``, else ``key_added``.

    Two runs of a step under different ``key_added`` thus keep their own records, and the default run's record stays
    where the workflow, the report and :func:`cape.tl.predict_intervention` read it.
    """
    return step if key_added == default else str(key_added)


def step_record(adata: ad.AnnData, step: str, key_added: str, default: str):
    """The record a step wrote for ``key_added`` (see :func:`step_key`), or None."""
    cape_uns = adata.uns.get("cape")
    return cape_uns.get(step_key(step, key_added, default)) if isinstance(cape_uns, Mapping) else None


def record_step(adata: ad.AnnData, step: str, entry: dict, key: str | None = None) -> None:
    """Store ``entry`` with the library versions in ``uns["cape"][key]`` (default: ``step``)."""
    cape_uns = adata.uns.setdefault("cape", {})
    entry = h5ad_safe({**entry, "versions": {"cape": __version__, "torch": str(torch.__version__),
                                   "geoopt": str(getattr(geoopt, "__version__", "unknown")),
                                   "python": platform.python_version()}})
    cape_uns[key or step] = entry


def h5ad_safe(obj):
    """h5ad cannot store None: write it as the string "none" (e.g. ``negatives=None`` = exact loss)."""
    if isinstance(obj, dict):
        return {str(k): h5ad_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [h5ad_safe(v) for v in obj]
    return "none" if obj is None else obj
