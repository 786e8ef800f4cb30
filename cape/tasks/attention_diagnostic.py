"""Behind-RoPE's non-relativity index per layer of a trained :class:`~cape.models.CellTransformer`.

Each cell tokenises its own subset of genes, so a gene pair's logit is averaged over the cells in which both
genes were tokenised (and over heads) — the gene analogue of averaging a sequence model over sequences. The
resulting genes × genes mean-logit matrix of every layer goes to
:func:`cape.encodings.non_relativity.non_relativity` with a
relative key per gene pair:

* ``key="model"``: the positions the model's own encoding uses — Poincaré/angle vectors (CAPE, GRAPE-M...),
  binned by distance, or a scalar order (RoPE on the DAG), binned by offset;
* ``key="<varm key>"`` (e.g. ``"cape_poincare"``): vectors from the AnnData, so that models whose encoding has
  no positions (``none``, ``trainable_absolute``) can be measured against the same causal geometry.

The logits are the layer's q·k/√d (plus any bias) after the encoding's transform, computed from the hidden
state that enters the layer (a forward hook; the genes×genes matrix exists only here, never in training).
Performer layers are measured on the exact softmax logits that FAVOR+ approximates.

Memory: the genes × genes matrices span only the genes that have a position under ``key``, at most
:data:`MAX_GENES` of them (the ones detected in the most sampled cells, with a log line when the cap applies),
never the whole vocabulary.
"""

from __future__ import annotations

import logging

import anndata as ad
import numpy as np
import scipy.sparse as sp
import torch

from .._errors import CapeInputError
from ..encodings.non_relativity import non_relativity
from ..models import CellTransformer

__all__ = ["MAX_GENES", "layer_mean_logits", "layer_non_relativity"]

logger = logging.getLogger("cape")

#: Most genes whose pairs :func:`layer_non_relativity` measures: its genes × genes tables (mean logits per layer,
#: counts, pairwise Poincaré distances over the position dimensions) stay within a few hundred MB at 1,000 genes.
MAX_GENES = 1000


def _layer_attention_modules(model: CellTransformer) -> list:
    layers = getattr(model.backbone, "layers", None)
    if layers is None:
        raise CapeInputError(f"backbone {type(model.backbone).__name__} has no encoder layers to inspect")
    return [layer.self_attn for layer in layers]


def _heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    b, length, d = x.shape
    return x.view(b, length, n_heads, d // n_heads).transpose(1, 2)


def _sample_cells(adata: ad.AnnData, n_cells: int | None, seed: int) -> ad.AnnData:
    if n_cells is not None and n_cells < 1:
        raise CapeInputError(f"n_cells must be at least 1, got {n_cells}")
    if n_cells is not None and n_cells < adata.n_obs:
        rows = np.sort(np.random.default_rng(seed).choice(adata.n_obs, n_cells, replace=False))
        adata = adata[rows]
    return adata


def layer_mean_logits(model: CellTransformer, adata: ad.AnnData, *, n_cells: int | None = 256, batch_size: int = 32,
                      seed: int = 0, genes: np.ndarray | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """Per layer, the gene × gene attention logit averaged over heads and over the cells holding both genes.

    Returns ``(means, counts)``: ``means[l]`` is (G, G) over the vocabulary indices ``genes`` (default: the whole
    vocabulary, then indexed by token id) with NaN where a pair never co-occurs, ``counts`` (G, G) the number of
    cells behind each mean (same for every layer). ``<cls>`` and padding are left out, and so are tokens outside
    ``genes``. ``n_cells`` cells are drawn at random (seeded; None = all). The tables take 8·G² bytes each per
    layer: without ``genes`` the vocabulary may hold at most :data:`MAX_GENES` tokens (else an error).
    """

    adata = _sample_cells(adata, n_cells, seed)
    attn_modules = _layer_attention_modules(model)
    if genes is None:
        if len(model.vocab) > MAX_GENES:
            raise CapeInputError(f"the vocabulary has {len(model.vocab)} tokens (at most {MAX_GENES} without "
                                 "genes=): pass the vocabulary indices to measure as genes=")
        genes = np.arange(len(model.vocab))
    genes = np.asarray(genes, dtype=np.int64)
    n_genes = int(genes.size)
    dev = model.device
    local = torch.full((len(model.vocab),), -1, dtype=torch.long, device=dev)  # vocabulary index → row
    local[torch.as_tensor(genes, device=dev)] = torch.arange(n_genes, device=dev)
    sums = [torch.zeros(n_genes * n_genes, dtype=torch.float64, device=dev) for _ in attn_modules]
    counts = torch.zeros(n_genes * n_genes, dtype=torch.float64, device=dev)
    pair_index: dict[str, torch.Tensor] = {}

    def hook(layer: int):
        def capture(module, args, output):
            x, encoding, ctx, layer_id = args
            q, k, _ = module.in_proj(x).chunk(3, dim=-1)
            logits = encoding.logits(_heads(q, module.n_heads), _heads(k, module.n_heads), ctx, layer_id)
            mean = logits.float().mean(dim=1)  # over heads → (B, L, L)
            keep = pair_index["keep"]
            sums[layer].index_add_(0, pair_index["flat"], mean.reshape(-1)[keep].double())
        return capture

    handles = [m.register_forward_hook(hook(i)) for i, m in enumerate(attn_modules)]
    model.module.eval()
    try:
        with torch.no_grad():
            for batch in model.batches(adata, batch_size=batch_size):
                ids = batch["gene_ids"]
                rows = local[ids]
                gene = ~batch["padding_mask"] & (rows >= 0)
                gene[:, 0] = False  # <cls>
                pair = gene[:, :, None] & gene[:, None, :]
                keep = pair.reshape(-1).nonzero().squeeze(1)
                flat = (rows[:, :, None] * n_genes + rows[:, None, :]).reshape(-1)[keep]
                pair_index.update(keep=keep, flat=flat)
                counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.float64))
                model.backbone(ids, batch["values"], batch["padding_mask"])
    finally:
        for h in handles:
            h.remove()
    count = counts.view(n_genes, n_genes).cpu().numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        means = [np.where(count > 0, s.view(n_genes, n_genes).cpu().numpy() / count, np.nan) for s in sums]
    return means, count


def _most_detected(model: CellTransformer, adata: ad.AnnData, candidates: np.ndarray, max_genes: int) -> np.ndarray:
    """The ``max_genes`` vocabulary indices of ``candidates`` expressed in the most cells of ``adata`` (sorted)."""

    X, names = model.expression(adata)
    ids = model.vocab.lookup(list(names))
    cols = np.flatnonzero(np.isin(ids, candidates))
    sub = X[:, cols]
    detected = np.asarray((sub > 0).sum(axis=0)).ravel() if sp.issparse(sub) else (np.asarray(sub) > 0).sum(0)
    top = cols[np.argsort(-detected, kind="stable")[:max_genes]]
    return np.sort(ids[top])


def _key_vectors(model: CellTransformer, adata: ad.AnnData, key: str) -> tuple[np.ndarray, str]:
    """(V, d) vectors or (V,) order over the vocabulary (NaN: no position) and the metric to bin them by."""
    if key == "model":
        # The field the encoding reads: an order for "cape_dag" (RoPE on the DAG), vectors otherwise.
        encoding = model.backbone.encoding
        requires, pos = type(encoding).requires, model.positions
        per_cell = getattr(encoding, "order", None) == "expression" or requires == "values"
        if pos is not None and not per_cell:
            if requires == "cape_dag" and pos.order is not None:
                return pos.order.double().cpu().numpy(), "offset"
            if requires != "cape_dag" and pos.vectors is not None:
                return pos.vectors.double().cpu().numpy(), "euclidean"
        raise CapeInputError(f"encoding '{model.backbone.encoding_name}' has no gene positions; measure against "
                             "the causal geometry instead, e.g. key='cape_poincare'")
    if key not in adata.varm:
        raise CapeInputError(f"adata.varm[{key!r}] not found (run cape.tl.hyperbolic_embedding, or use key='model')")
    values = np.asarray(adata.varm[key], dtype=np.float64)
    if "cape_used" in adata.var:
        values = np.where(np.asarray(adata.var["cape_used"], dtype=bool)[:, None], values, np.nan)
    table = np.full((len(model.vocab), values.shape[1]), np.nan)
    idx = model.vocab.lookup(list(adata.var_names))
    known = idx >= 0
    table[idx[known]] = values[known]
    return table, "poincare" if key == "cape_poincare" else "euclidean"


def layer_non_relativity(model: CellTransformer, adata: ad.AnnData, *, key: str = "model", n_cells: int | None = 256,
                         min_cells: int = 3, bins: int | None = 32, batch_size: int = 32, seed: int = 0,
                         max_genes: int = MAX_GENES) -> list[dict]:
    """Non-relativity index of every layer of ``model`` on the cells of ``adata``.

    Parameters
    ----------
    model
        A trained (or just built) :class:`~cape.models.CellTransformer`.
    adata
        Cells to run (the model's genes); also the source of ``key`` vectors.
    key
        ``"model"`` (the encoding's own positions) or a ``varm`` key such as ``"cape_poincare"`` (binned by
        Poincaré distance; other keys by Euclidean distance). Genes without a position are left out.
    n_cells
        Cells sampled (seeded) to average over; None = all.
    min_cells
        A gene pair enters only when both genes were tokenised together in at least this many cells (fewer
        makes its mean logit mostly noise, which reads as non-relativity).
    bins
        Quantile bins of the relative key (None: exact values, e.g. integer offsets).
    max_genes
        Cap on the genes measured (default :data:`MAX_GENES`): only genes with a position enter, and when more than
        ``max_genes`` have one, the ``max_genes`` expressed in the most sampled cells are kept (logged). Memory is
        O(max_genes²), whatever the vocabulary.

    Returns
    -------
    One record per layer: ``layer``, ``nri`` (0 = logits depend on the relative key only, ~1 = unrelated),
    ``n_pairs``, ``n_genes``, ``key``, ``metric``.
    """
    if min_cells < 1:
        raise CapeInputError(f"min_cells must be at least 1, got {min_cells}")
    if max_genes < 3:
        raise CapeInputError(f"max_genes must be at least 3, got {max_genes}")
    positions, metric = _key_vectors(model, adata, key)
    has = np.isfinite(positions) if positions.ndim == 1 else np.isfinite(positions).all(axis=1)
    adata = _sample_cells(adata, n_cells, seed)
    candidates = np.flatnonzero(has)
    if candidates.size > max_genes:
        logger.info("non-relativity (%s): %d genes have a position; measuring the %d detected in the most cells "
                    "(max_genes)", key, candidates.size, max_genes)
        candidates = _most_detected(model, adata, candidates, max_genes)
    means, count = layer_mean_logits(model, adata, n_cells=None, batch_size=batch_size, genes=candidates)
    genes = np.flatnonzero((count >= min_cells).sum(axis=1) > 0)  # rows of the tables (= of candidates)
    sub_count = count[np.ix_(genes, genes)]
    include = sub_count >= min_cells
    np.fill_diagonal(include, False)
    if genes.size < 3 or include.sum() < 10:
        raise CapeInputError(f"too few gene pairs with a position seen together in ≥ {min_cells} cells "
                             f"({int(include.sum())}); use more cells or a smaller min_cells")
    records = []
    for layer, mean in enumerate(means):
        sub = np.nan_to_num(mean[np.ix_(genes, genes)])
        nri = non_relativity(sub, positions[candidates[genes]], metric=metric, bins=bins, mask=include)
        records.append({"layer": layer, "nri": nri, "n_pairs": int(include.sum()), "n_genes": int(genes.size),
                        "key": key, "metric": metric})
        logger.info("layer %d: non-relativity %.3f over %d gene pairs (%s)", layer, nri, int(include.sum()), key)
    return records
