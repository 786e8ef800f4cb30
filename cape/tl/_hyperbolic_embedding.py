"""Step II on AnnData: hyperbolic embedding of ``varp["cape_dag"]`` (CAPE Sec. 3.4).

Fields set: ``varm["cape_lorentz"]`` (n_vars, d+1) hyperboloid points (hyperbolic geometry only; removed for the
Euclidean ablation), ``varm["cape_poincare"]`` (n_vars, d) Poincaré-ball positions, ``var["cape_generality"]``
PageRank π, ``var["cape_embedded"]`` (took part in Step II), ``var["cape_connected"]`` (has an edge),
``uns["cape"]["hyperbolic_embedding"]``."""

from __future__ import annotations

import logging

import anndata as ad
import numpy as np

from .._errors import CapeInputError
from .._options import with_options
from .._settings import resolve_seed
from ..hyperbolic.adjacency import as_sparse_adjacency
from ..hyperbolic.embedding import EmbeddingResult, embed_dag
from ..hyperbolic.embedding_config import EmbeddingConfig
from ..hyperbolic.hierarchy import MIN_HIERARCHY_SPEARMAN, hierarchy_spearman
from ._uns import DAG_KEY, record_step

logger = logging.getLogger("cape")


def _adjacency_from(adata: ad.AnnData, adjacency, dag_key: str):
    if adjacency is None:
        if dag_key not in adata.varp:
            raise CapeInputError(
                f"varp[{dag_key!r}] not found: learn the causal graph first with `cape causal` "
                "(cape.tl.causal_graph) or pass adjacency=")
        return as_sparse_adjacency(adata.varp[dag_key], what=f"varp[{dag_key!r}]"), f"varp[{dag_key!r}]"
    matrix = as_sparse_adjacency(adjacency, what="the supplied adjacency")
    if matrix.shape[0] != adata.n_vars:
        raise CapeInputError(f"the supplied adjacency is {matrix.shape[0]}×{matrix.shape[1]} but the AnnData has "
                             f"{adata.n_vars} genes; it must be n_vars × n_vars in var_names order")
    return matrix, "adjacency argument"


def hyperbolic_embedding(adata: ad.AnnData, config: EmbeddingConfig | None = None, *, adjacency=None,
                         dag_key: str = DAG_KEY, copy: bool = False, device: str | None = "auto", seed: int | None = 0,
                         **options) -> ad.AnnData | None:
    """Embed the gene DAG in hyperbolic space (CAPE Step II, Sec. 3.4).

    Parameters
    ----------
    adata
        AnnData with the weighted DAG in ``varp[dag_key]`` (``A[i, j] != 0``: gene i → gene j), as written by
        :func:`cape.tl.causal_graph`.
    config
        Step II's options (:class:`~cape.hyperbolic.EmbeddingConfig`): ``dim`` (d ≥ 2; the paper uses D/2 of the
        transformer width), ``k_hop`` (genes joined by a directed path of ≤ k_hop edges are positives of Eq. 16,
        weighted by the strongest path product), ``lambda_g`` (Eq. 17), ``restart`` (PageRank, Eq. 18), ``epochs``,
        ``lr``, ``optimizer`` (``"rsgd"`` or ``"radam"``), ``geometry`` (``"hyperbolic"``, or ``"euclidean"``: the
        CAPE-w/o-hyperbolic ablation, whose ``varm["cape_poincare"]`` holds the Euclidean points scaled uniformly into
        the unit ball), ``negatives`` (``None`` exact, an int K sampled, ``"auto"``: exact up to 1,500 genes),
        ``max_radius``, ``init_scale``, ``temperature`` (τ dividing the contrastive distances; 1 is the paper's Eq. 16)
        and ``isolated`` (``"negatives"``: genes of ``var["cape_used"]`` without an edge take part as negatives of
        every anchor and are spread apart, so every gene gets its own position; ``"origin"``: they stay at the
        origin) and ``positive_weights`` (``"path"``: Eq. 16's weights; ``"per_anchor"``: each gene's positive weights
        divided by their sum, so hubs are not pushed towards the rim). Default: the workflow's defaults.
    adjacency
        Optional n_vars × n_vars adjacency to use instead of ``varp[dag_key]``.
    dag_key
        Key of the DAG in ``varp``.
    copy
        Return a modified copy instead of writing into ``adata``.
    device
        ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
    seed
        Random seed (``None``: ``cape.settings.seed``).
    **options
        Fields of :class:`~cape.hyperbolic.EmbeddingConfig` by name (e.g. ``dim=8, epochs=200``), replacing those
        of ``config``; another name raises :class:`~cape.CapeInputError`.

    Reads
    -----
    ``varp["cape_dag"]`` (``dag_key``, or ``adjacency``) and ``var["cape_used"]``.

    Writes
    ------
    ``varm["cape_lorentz"]`` (``varm["cape_euclidean"]`` for the Euclidean geometry), ``varm["cape_poincare"]``,
    ``var["cape_generality"]``, ``var["cape_embedded"]`` (took part in Step II), ``var["cape_connected"]`` (has an
    edge) and ``uns["cape"]["hyperbolic_embedding"]``, whose ``fraction_at_origin`` is the share of the used genes
    within 1e-3 of the origin and ``hierarchy_spearman`` Spearman(π, −‖e‖) over the ``hierarchy_n_genes`` genes with
    an edge (NaN when undefined; a warning is logged below
    :data:`~cape.hyperbolic.hierarchy.MIN_HIERARCHY_SPEARMAN`).
    These keys are fixed: Steps III and the models read them.

    Returns
    -------
    ``None``, or the copy when ``copy=True``.
    """
    config = with_options(EmbeddingConfig, config, options, "hyperbolic_embedding")
    adata = adata.copy() if copy else adata
    matrix, source = _adjacency_from(adata, adjacency, dag_key)
    used = None
    if "cape_used" in adata.var:
        used = adata.var["cape_used"].to_numpy(dtype=bool)
        outside = matrix.tocoo()
        if outside.nnz and not (used[outside.row].all() and used[outside.col].all()):
            logger.warning("%s has edges on genes outside var['cape_used']; embedding them anyway", source)
    seed = resolve_seed(seed)
    result = embed_dag(matrix, config, device=device, seed=seed, names=list(adata.var_names), nodes=used)
    _write(adata, result, used)
    at_origin = result.fraction_at_origin(used)
    hierarchy = hierarchy_spearman(result.generality, result.poincare, result.connected)
    losses = result.losses
    record_step(adata, "hyperbolic_embedding", {
        "params": {"device": str(device), **result.params, "source": source},
        "seed": seed,
        "n_genes_embedded": int(result.embedded.sum()),
        "n_genes_connected": int(result.connected.sum()),
        "fraction_at_origin": at_origin,
        "hierarchy_spearman": hierarchy.spearman,
        "hierarchy_n_genes": hierarchy.n_genes,
        "n_positive_pairs": int(result.n_positive_pairs),
        "final_loss": float(losses[-1]) if losses.size else float("nan"),
        "loss_curve": losses[:: max(1, losses.size // 200)].tolist(),
        "seconds": float(result.seconds),
    })
    logger.info("Step II: embedded %d genes (%d with an edge, %d positive pairs) in %s space, d=%d, %.1f s; "
                "%.1f%% of the genes within 1e-3 of the origin", int(result.embedded.sum()),
                int(result.connected.sum()), result.n_positive_pairs, config.geometry, config.dim, result.seconds,
                100 * at_origin)
    if hierarchy.n_genes and hierarchy.missing:
        rho = f"= {hierarchy.spearman:.2f}" if np.isfinite(hierarchy.spearman) else "is undefined"
        logger.warning("Step II: the positions do not follow the graph's hierarchy: Spearman(generality, -norm) %s "
                       "over the %d genes with an edge (general genes should sit near the origin; below %.1f they do "
                       "not), so CAPE's encoding gives these genes distinct positions (an identity), not a causal "
                       "hierarchy%s", rho, hierarchy.n_genes, MIN_HIERARCHY_SPEARMAN,
                       "; positive_weights='per_anchor' keeps hubs nearer the origin" if
                       config.positive_weights == "path" else "")
    return adata if copy else None


def _write(adata: ad.AnnData, result: EmbeddingResult, used: np.ndarray | None) -> None:
    """The points, Poincaré positions, generality and node flags of ``result`` into ``adata``."""
    generality = result.generality
    if used is not None:
        # π of genes outside the causal graph is not a generality; renormalise over the genes that took part.
        generality = np.where(used, generality, 0.0)
        generality = generality / generality.sum() if generality.sum() > 0 else generality
    if result.geometry == "hyperbolic":
        adata.varm["cape_lorentz"] = result.points
    else:
        adata.varm.pop("cape_lorentz", None)
        adata.varm["cape_euclidean"] = result.points
    adata.varm["cape_poincare"] = result.poincare
    adata.var["cape_generality"] = generality
    adata.var["cape_embedded"] = result.embedded
    adata.var["cape_connected"] = result.connected
