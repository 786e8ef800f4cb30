"""Inference of a :class:`~cape.models.CellTransformer`: hidden states of all cells, cell embeddings (pooled
hidden states) and contextual gene embeddings."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from .._progress import progress
from .heads import check_pooling, pool_cells
from .tokenize import CellCollator

if TYPE_CHECKING:
    from .transformer import CellTransformer

logger = logging.getLogger("cape")


@torch.no_grad()
def forward_all(model: CellTransformer, adata, batch_size: int, fn: Callable[[Tensor, dict[str, Tensor]], Any]
                ) -> list:
    """``fn(hidden states, batch)`` for the batches of ``adata``'s cells, in order, in eval mode."""
    data = model._dataset(adata)
    loader = DataLoader(data, batch_size=batch_size, shuffle=False, collate_fn=CellCollator(model.vocab.pad_id))
    model.module.eval()
    out = []
    for batch in progress(loader, desc="inference"):
        batch = model._to_device(batch)
        with model._autocast():
            hidden = model.backbone(batch["gene_ids"], batch["values"], batch["padding_mask"])
        out.append(fn(hidden.float(), batch))
    return out


def embeddings(model: CellTransformer, adata, batch_size: int, pooling: str | None, genes: bool
               ) -> tuple[np.ndarray, Tensor | None, Tensor | None]:
    """Cell embeddings and, with ``genes``, the per-gene sums and counts of contextual hidden states."""
    n_vocab, d = len(model.vocab), model.backbone.d_model
    gene_sum = torch.zeros(n_vocab, d, dtype=torch.float64, device=model.device) if genes else None
    gene_n = torch.zeros(n_vocab, dtype=torch.float64, device=model.device) if genes else None

    def take(hidden: Tensor, batch: dict[str, Tensor]) -> Tensor:
        if genes:
            ids = batch["gene_ids"][:, 1:].reshape(-1)
            keep = ~batch["padding_mask"][:, 1:].reshape(-1)
            gene_sum.index_add_(0, ids[keep], hidden[:, 1:].reshape(-1, d)[keep].double())
            gene_n.index_add_(0, ids[keep], torch.ones_like(ids[keep], dtype=torch.float64))
        return pool_cells(hidden, batch["padding_mask"], pooling).cpu()

    pooling = check_pooling(pooling or model.pooling)
    cells = torch.cat(forward_all(model, adata, batch_size, take)).numpy().astype(np.float32)
    return cells, gene_sum, gene_n


def write_gene_embedding(model: CellTransformer, adata, gene_key: str, gene_sum: Tensor, gene_n: Tensor) -> None:
    """Gene embeddings (mean hidden state over the cells where the gene was tokenised) → ``varm[gene_key]``, their
    cell counts → ``var[f"{gene_key}_n_cells"]``."""
    mean = (gene_sum / gene_n.clamp(min=1)[:, None]).cpu().numpy().astype(np.float32)
    _, names = model._expression(adata)
    if model.use_raw:
        logger.info("gene embeddings not stored: use_raw genes are not adata.var_names")
        return
    rows = model.vocab.lookup(names)
    known = rows >= 0  # genes outside an imported vocabulary get zeros and a count of 0
    table = np.zeros((len(rows), mean.shape[1]), dtype=np.float32)
    table[known] = mean[rows[known]]
    counts = np.zeros(len(rows), dtype=np.int64)
    counts[known] = gene_n.cpu().numpy()[rows[known]].astype(np.int64)
    adata.varm[gene_key] = table
    adata.var[f"{gene_key}_n_cells"] = counts
