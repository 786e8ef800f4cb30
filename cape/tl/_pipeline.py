"""CAPE Steps I–III on AnnData in one call: causal graph → hyperbolic embedding → rotary angles."""

from __future__ import annotations

import math
import time

import anndata as ad

from .._settings import resolve_seed
from ..causal.causal_config import CausalConfig
from ..hyperbolic.embedding_config import EmbeddingConfig
from ._causal_graph import causal_graph
from ._hyperbolic_embedding import hyperbolic_embedding
from ._rotary_encoding import rotary_encoding


def cape(adata: ad.AnnData, causal: CausalConfig | None = None, embedding: EmbeddingConfig | None = None, *,
         scale: float = math.pi / 4, causal_kwargs: dict | None = None, embed_kwargs: dict | None = None,
         device: str | None = "auto", seed: int | None = 0, copy: bool = False, **options) -> ad.AnnData | None:
    """Run CAPE Steps I–III in one call: causal graph → hyperbolic embedding → rotary angles.

    Step I is :func:`cape.tl.causal_graph` with ``causal`` and ``causal_kwargs`` (plus ``device`` and ``seed``);
    Step II is :func:`hyperbolic_embedding` with ``embedding``, ``options`` and ``embed_kwargs``; Step III is
    :func:`rotary_encoding` with ``scale``.

    Parameters
    ----------
    adata
        Cells × genes, preprocessed (e.g. by :func:`cape.pp.preprocess`).
    causal
        Step I's options (:class:`~cape.causal.CausalConfig`; default: its defaults).
    embedding
        Step II's options (:class:`~cape.hyperbolic.EmbeddingConfig`; default: its defaults).
    scale
        Step III's c, see :func:`cape.tl.rotary_encoding`.
    causal_kwargs, embed_kwargs
        Further keywords of :func:`cape.tl.causal_graph` and :func:`cape.tl.hyperbolic_embedding` (options or
        their other keywords, e.g. ``use_genes``, ``dag_key``).
    device
        ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``, for Steps I and II.
    seed
        Seed of Steps I and II (``None``: ``cape.settings.seed``).
    copy
        Return a modified copy instead of writing into ``adata``.
    **options
        Fields of :class:`~cape.hyperbolic.EmbeddingConfig` by name (e.g. ``dim=8, epochs=200``), for Step II.

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
    causal_graph(adata, **({} if causal is None else {"config": causal}), device=device, seed=seed,
                 **(causal_kwargs or {}))
    hyperbolic_embedding(adata, embedding, device=device, seed=seed, **{**options, **(embed_kwargs or {})})
    rotary_encoding(adata, scale=scale)
    adata.uns["cape"]["pipeline"] = {"steps": ["causal_graph", "hyperbolic_embedding", "rotary_encoding"],
                                     "seed": seed, "seconds": time.perf_counter() - start}
    return adata if copy else None
