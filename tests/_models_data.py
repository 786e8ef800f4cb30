"""Small AnnData with stand-in CAPE keys for the model tests.

Steps I–III are not run here: ``varp["cape_dag"]`` is a random DAG (edges from lower to higher gene index),
``varm["cape_poincare"]`` random points in the unit ball, ``varm["cape_angles"] = π/4 · e`` and
``var["cape_generality"]`` random. Models only need these keys' shapes and meaning, not their values.
"""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch


def cape_adata(n_cells: int = 48, n_genes: int = 24, seed: int = 0, dim: int = 4) -> ad.AnnData:
    rng = np.random.default_rng(seed)
    groups = np.repeat(["t", "b", "nk"], -(-n_cells // 3))[:n_cells]
    rates = rng.gamma(1.0, 1.0, size=(3, n_genes)) * 1.5
    rates[:, :6] *= np.array([[4.0], [0.2], [1.0]])          # marker genes separate the groups
    counts = rng.poisson(rates[pd.Categorical(groups, categories=["t", "b", "nk"]).codes]).astype(np.float32)
    adata = ad.AnnData(sp.csr_matrix(np.log1p(counts)))
    adata.obs_names = [f"cell{i}" for i in range(n_cells)]
    adata.var_names = [f"GENE{i}" for i in range(n_genes)]
    adata.obs["cell_type"] = pd.Categorical(groups)
    dag = np.triu(rng.random((n_genes, n_genes)) < 0.15, k=1) * rng.uniform(0.3, 1.0, (n_genes, n_genes))
    used = np.ones(n_genes, dtype=bool)
    used[-2:] = False                                        # two genes outside the causal graph
    dag[~used, :] = 0
    dag[:, ~used] = 0
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    e = rng.normal(size=(n_genes, dim))
    e *= (0.8 * rng.random((n_genes, 1))) / np.linalg.norm(e, axis=1, keepdims=True)
    adata.varm["cape_poincare"] = e
    adata.varm["cape_angles"] = np.pi / 4 * e
    adata.var["cape_generality"] = rng.random(n_genes)
    adata.var["cape_used"] = used
    return adata


def with_unused_genes(adata, n_extra: int = 30):
    """``adata`` plus ``n_extra`` expressed genes outside var["cape_used"] (a raw matrix's other genes)."""
    rng = np.random.default_rng(5)
    extra = sp.csr_matrix(np.log1p(rng.poisson(2.0, size=(adata.n_obs, n_extra))).astype(np.float32))
    wide = ad.AnnData(sp.hstack([adata.X, extra]).tocsr(), obs=adata.obs.copy())
    wide.var_names = [*adata.var_names, *(f"OTHER{i}" for i in range(n_extra))]
    wide.var["cape_used"] = np.r_[adata.var["cape_used"].to_numpy(), np.zeros(n_extra, dtype=bool)]
    for key, value in adata.varm.items():
        wide.varm[key] = np.r_[value, np.full((n_extra, value.shape[1]), np.nan)]
    wide.var["cape_generality"] = np.r_[adata.var["cape_generality"].to_numpy(), np.zeros(n_extra)]
    wide.varp["cape_dag"] = sp.block_diag([adata.varp["cape_dag"], sp.csr_matrix((n_extra, n_extra))]).tocsr()
    return wide


@pytest.fixture
def one_thread():
    """One intra-op thread: the test machine's 2 cores are shared, and OpenMP spinning with 2 threads on a
    loaded machine makes these tiny models ~50x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
