"""CAPE Steps I–III on AnnData in one call: causal graph → hyperbolic embedding → rotary angles."""

from __future__ import annotations

import math
import time
from typing import Literal

import anndata as ad

from .._settings import resolve_seed
from .causal_graph import causal_graph
from .hyperbolic import hyperbolic_embedding
from .rotary import rotary_encoding


def cape(adata: ad.AnnData, *, dim: int = 32, k_hop: int = 2, lambda_g: float = 0.1, restart: float = 0.15,
         epochs: int = 1000, optimizer: Literal["rsgd", "radam"] = "rsgd",
         geometry: Literal["hyperbolic", "euclidean"] = "hyperbolic", scale: float = math.pi / 4,
         causal_kwargs: dict | None = None, embed_kwargs: dict | None = None, device: str | None = "auto",
         seed: int | None = 0, copy: bool = False) -> ad.AnnData | None:
    """Run CAPE Steps I–III in one call: causal graph → hyperbolic embedding → rotary angles.

    Step I is :func:`cape.tl.causal_graph` with ``causal_kwargs`` (plus ``device`` and ``seed``); Step II is
    :func:`hyperbolic_embedding` with the arguments above and ``embed_kwargs``; Step III is
    :func:`rotary_encoding` with ``scale``.

    Parameters
    ----------
    adata
        Cells × genes, preprocessed (e.g. by :func:`cape.pp.preprocess`).
    dim, k_hop, lambda_g, restart, epochs, optimizer, geometry
        Step II, see :func:`cape.tl.hyperbolic_embedding`.
    scale
        Step III's c, see :func:`cape.tl.rotary_encoding`.
    causal_kwargs, embed_kwargs
        Further keywords of :func:`cape.tl.causal_graph` and :func:`cape.tl.hyperbolic_embedding`.
    device
        ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``, for Steps I and II.
    seed
        Seed of Steps I and II (``None``: ``cape.settings.seed``).
    copy
        Return a modified copy instead of writing into ``adata``.

    Reads
    -----
    ``X`` and ``var["cape_used"]`` (see :func:`cape.tl.causal_graph`).

    Writes
    ------
    Every field the three steps write: ``varp["cape_dag"]``, ``var["cape_used"]``, ``varm["cape_lorentz"]``,
    ``varm["cape_poincare"]``, ``var["cape_generality"]``, ``var["cape_embedded"]``, ``var["cape_connected"]``,
    ``varm["cape_angles"]``, and ``uns["cape"]`` (one entry per step and ``uns["cape"]["pipeline"]``).

    Returns
    -------
    ``None``, or the copy when ``copy=True``.
    """
    adata = adata.copy() if copy else adata
    seed = resolve_seed(seed)
    start = time.perf_counter()
    causal_graph(adata, **{"device": device, "seed": seed, **(causal_kwargs or {})})
    hyperbolic_embedding(adata, dim=dim, k_hop=k_hop, lambda_g=lambda_g, restart=restart, epochs=epochs,
                         optimizer=optimizer, geometry=geometry, device=device, seed=seed,
                         **(embed_kwargs or {}))
    rotary_encoding(adata, scale=scale)
    adata.uns["cape"]["pipeline"] = {"steps": ["causal_graph", "hyperbolic_embedding", "rotary_encoding"],
                                     "seed": seed, "seconds": time.perf_counter() - start}
    return adata if copy else None
