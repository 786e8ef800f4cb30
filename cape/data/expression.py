"""Expression matrices shaped like real single-cell runs: sparse 10x UMI counts or SMART-seq-style TPM.

They exist to try the pipeline on data shaped like a user's (tens of thousands of genes, most of them rarely
detected, library sizes that vary per cell, cell types, sometimes fewer cells than genes) without a download.
A known regulatory DAG among the better-expressed genes drives part of the variation, so Step I has something to
find and its graph can be scored.
"""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

from .._errors import CapeInputError
from .perturbation_data import random_dag

__all__ = ["simulate_expression"]

_KINDS = ("umi", "tpm")


def _regulated_log_expression(n_cells: int, w: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """Centred log fold changes from the linear SEM ``z = z W + ε`` on the DAG ``W`` (solved, not iterated)."""
    eps = rng.normal(0.0, noise, size=(n_cells, w.shape[0]))
    # z (I - W) = ε, and I - W is invertible because W is a DAG (nilpotent).
    z = np.linalg.solve((np.eye(w.shape[0]) - w).T, eps.T).T
    return z / np.maximum(z.std(axis=0), 1e-12) * noise


def negative_binomial_counts(mu: np.ndarray, dispersion: float, rng: np.random.Generator) -> np.ndarray:
    """Negative-binomial counts with means ``mu`` and shape θ = ``dispersion`` (variance μ + μ²/θ), drawn as the
    Poisson–gamma mixture."""
    return rng.poisson(rng.gamma(dispersion, mu / dispersion))


def simulate_expression(n_cells: int, n_genes: int, *, kind: str = "umi", n_cell_types: int = 5,
                        n_regulated: int = 200, edges_per_gene: float = 1.5, depth: float | None = None,
                        dispersion: float = 2.0, seed: int = 0, chunk_cells: int = 512) -> ad.AnnData:
    """A synthetic cells × genes matrix with the sparsity and scale of a real run.

    Parameters
    ----------
    n_cells, n_genes
        Shape. A 10x run is about 5,000-10,000 cells × 33,000 genes; a SMART-seq plate a few hundred cells
        × 10,000-20,000 genes.
    kind
        ``"umi"``: integer UMI counts, sparse CSR, library sizes log-normal around ``depth`` (default 5,000),
        most genes detected in few cells. ``"tpm"``: SMART-seq-like transcripts per million (float, rows sum to
        1e6, divided by a per-gene length), stored dense as such tables are (default depth 200,000 reads).
    n_cell_types
        Cell types in ``obs["cell_type"]``; each shifts the mean of a random 5 % of the genes.
    n_regulated
        Genes (chosen among the better expressed) whose log expression follows a linear SEM on a random DAG
        with about ``edges_per_gene · n_regulated`` edges; the DAG is in ``varp["true_dag"]`` (full size).
    dispersion
        Negative-binomial shape θ (variance μ + μ²/θ) of the counts.
    seed
        Seeds everything.
    chunk_cells
        Cells drawn at a time, so memory stays at a few chunks of dense values whatever the shape.

    Returns
    -------
    AnnData with X (counts or TPM), ``obs["cell_type"]``, ``var["regulated"]``, ``varp["true_dag"]`` and
    ``uns["simulation"]`` (the parameters).
    """
    if kind not in _KINDS:
        raise CapeInputError(f"kind must be one of {', '.join(_KINDS)}, got {kind!r}")
    if n_cells < 1 or n_genes < 2:
        raise CapeInputError(f"need n_cells ≥ 1 and n_genes ≥ 2, got {n_cells} and {n_genes}")
    if not 0 <= n_regulated <= n_genes:
        raise CapeInputError(f"n_regulated must be in [0, n_genes = {n_genes}], got {n_regulated}")
    if n_cell_types < 1:
        raise CapeInputError(f"n_cell_types must be ≥ 1, got {n_cell_types}")
    rng = np.random.default_rng(seed)
    depth = float(depth if depth is not None else (5_000 if kind == "umi" else 200_000))

    # Relative gene abundances: log-normal with a heavy tail, as in real data (a few genes take most reads).
    log_abundance = rng.normal(0.0, 2.0, size=n_genes)
    cell_type = rng.integers(0, n_cell_types, size=n_cells)
    type_shift = np.zeros((n_cell_types, n_genes))
    for t in range(n_cell_types):
        marked = rng.choice(n_genes, size=max(1, n_genes // 20), replace=False)
        type_shift[t, marked] = rng.normal(0.0, 1.5, size=marked.size)

    # The regulated genes are drawn among the top quarter by abundance, where they survive HVG selection.
    top = np.argsort(-log_abundance)[: max(n_regulated, n_genes // 4)]
    regulated = np.sort(rng.choice(top, size=n_regulated, replace=False))
    n_edges = min(round(edges_per_gene * n_regulated), n_regulated * (n_regulated - 1) // 2)
    w = random_dag(n_regulated, n_edges, weight_range=(0.5, 1.0), rng=rng) if n_regulated >= 2 else \
        np.zeros((n_regulated, n_regulated))
    z = _regulated_log_expression(n_cells, w, noise=0.8, rng=rng) if n_regulated else np.zeros((n_cells, 0))

    library = depth * np.exp(rng.normal(0.0, 0.4, size=n_cells))
    length = np.exp(rng.normal(np.log(2_000), 0.6, size=n_genes)) if kind == "tpm" else None
    chunks = []
    for start in range(0, n_cells, chunk_cells):
        rows = slice(start, min(start + chunk_cells, n_cells))
        log_mu = log_abundance + type_shift[cell_type[rows]]
        log_mu[:, regulated] += z[rows]
        p = np.exp(log_mu - log_mu.max(axis=1, keepdims=True))
        mu = p / p.sum(axis=1, keepdims=True) * library[rows, None]
        counts = negative_binomial_counts(mu, dispersion, rng).astype(np.float32)
        if kind == "tpm":
            rate = counts / length
            chunks.append((rate / np.maximum(rate.sum(axis=1, keepdims=True), 1e-12) * 1e6).astype(np.float32))
        else:
            chunks.append(sp.csr_matrix(counts))
    X = np.vstack(chunks) if kind == "tpm" else sp.vstack(chunks, format="csr")

    genes = [f"GENE{i:05d}" for i in range(n_genes)]
    obs = pd.DataFrame({"cell_type": pd.Categorical([f"type{t}" for t in cell_type])},
                       index=[f"cell{i:05d}" for i in range(n_cells)])
    var = pd.DataFrame({"regulated": np.isin(np.arange(n_genes), regulated)}, index=genes)
    adata = ad.AnnData(X=X, obs=obs, var=var)
    rows_w, cols_w = np.nonzero(w)
    adata.varp["true_dag"] = sp.csr_matrix(
        (w[rows_w, cols_w].astype(np.float32), (regulated[rows_w], regulated[cols_w])), shape=(n_genes, n_genes))
    adata.uns["simulation"] = {"simulator": "cape.data.simulate_expression", "kind": kind,
                               "n_cells": int(n_cells), "n_genes": int(n_genes), "n_cell_types": int(n_cell_types),
                               "n_regulated": int(n_regulated), "n_edges": int(rows_w.size), "depth": depth,
                               "dispersion": float(dispersion), "seed": int(seed)}
    return adata
