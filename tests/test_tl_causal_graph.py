"""cape.tl.causal_graph on AnnData, its bad-input handling, the CLI and simulate_sem / dag_metrics."""

from __future__ import annotations

import logging

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch

from cape import CapeInputError
from cape.causal import is_dag
from cape.causal.structure_recovery import dag_metrics
from cape.data.simulate import simulate_sem
from cape.tl._causal_graph import MIN_CELLS, causal_graph

FAST = {"epochs": 2, "batch_size": 32, "device": "cpu"}


def _adata(n: int = 80, m: int = 6, seed: int = 0, sparse: bool = False) -> ad.AnnData:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, m)).astype(np.float32)
    if m > 1:
        X[:, 1] += X[:, 0]
    X = np.abs(X)
    a = ad.AnnData(X=sp.csr_matrix(X) if sparse else X, var=pd.DataFrame(index=[f"g{i}" for i in range(m)]))
    a.obs_names = [f"c{i}" for i in range(n)]
    return a


@pytest.mark.parametrize("sparse", [False, True])
def test_writes_full_size_sparse_dag_and_record(sparse: bool) -> None:
    a = _adata(sparse=sparse)
    a.var["cape_used"] = [True, True, True, True, False, True]
    causal_graph(a, rank=2, tau=0.0, seed=3, **FAST)
    dag = a.varp["cape_dag"]
    assert sp.issparse(dag) and dag.shape == (6, 6) and dag.dtype == np.float32
    assert is_dag(dag.toarray())
    assert dag[4].nnz == 0 and dag[:, 4].nnz == 0  # gene outside cape_used
    rec = a.uns["cape"]["causal_graph"]
    assert rec["params"]["seed"] == 3 and rec["rank_used"] == 2 and rec["n_genes"] == 5
    assert len(rec["history"]["h"]) == rec["epochs_run"] == 2
    assert rec["n_edges"] == dag.nnz and rec["removed_cycle_edges"] >= 0 and rec["wall_time"] > 0
    assert rec["rho_max"] == 1e4  # low rank's cap on the augmented Lagrangian's ρ
    stages = rec["stage_seconds"]
    assert list(stages) == ["checks", "screen", "fit", "edge_budget", "pair_ranking", "threshold", "orientation",
                            "edge_confidence", "equations"]
    assert min(stages.values()) >= 0 and rec["fit_seconds"] <= stages["fit"] <= sum(stages.values()) <= rec["wall_time"]


def test_same_seed_same_graph_and_copy() -> None:
    a = _adata()
    b = causal_graph(a, rank=None, tau=0.05, seed=1, copy=True, **FAST)
    c = causal_graph(a, rank=None, tau=0.05, seed=1, copy=True, **FAST)
    assert "cape_dag" not in a.varp
    np.testing.assert_array_equal(b.varp["cape_dag"].toarray(), c.varp["cape_dag"].toarray())


def test_constant_genes_are_dropped_with_a_warning_naming_them(caplog) -> None:
    a = _adata()
    a.X[:, 3] = 2.0
    with caplog.at_level(logging.WARNING, logger="cape"):
        causal_graph(a, rank=None, tau=0.0, **FAST)
    assert "g3" in caplog.text and "constant" in caplog.text
    assert not a.var["cape_used"]["g3"]
    assert a.varp["cape_dag"][3].nnz == 0 and a.varp["cape_dag"][:, 3].nnz == 0
    assert a.uns["cape"]["causal_graph"]["dropped_constant_genes"] == ["g3"]


def test_rank_at_least_genes_falls_back_to_dense(caplog) -> None:
    a = _adata(m=4)
    with caplog.at_level(logging.WARNING, logger="cape"):
        causal_graph(a, rank=40, **FAST)
    assert "dense" in caplog.text
    assert a.uns["cape"]["causal_graph"]["rank_used"] == "dense"


def test_fewer_cells_than_genes_warns_and_too_few_refuses(caplog) -> None:
    a = _adata(n=12, m=15)
    with caplog.at_level(logging.WARNING, logger="cape"):
        causal_graph(a, rank=3, **FAST)
    assert "fewer cells" in caplog.text
    with pytest.raises(CapeInputError, match=f"at least {MIN_CELLS} cells"):
        causal_graph(_adata(n=MIN_CELLS - 1), **FAST)


def test_raw_counts_without_a_gene_selection_are_refused(counts_adata, caplog) -> None:
    # a forgotten cape.pp.preprocess: Step I would run on every gene of the raw counts
    with pytest.raises(CapeInputError, match="raw counts and var\\['cape_used'\\] is missing: run cape.pp.preprocess"):
        causal_graph(counts_adata, **FAST)
    assert "cape_dag" not in counts_adata.varp
    # a layer is the user's choice of matrix: X's raw counts do not matter then
    counts_adata.layers["log"] = np.log1p(counts_adata.X)
    causal_graph(counts_adata[:, :6].copy(), layer="log", rank=None, tau=0.05, **FAST)
    # log-scale values without the selection use every gene, and say so
    a = _adata()
    with caplog.at_level(logging.WARNING, logger="cape"):
        causal_graph(a, rank=None, tau=0.05, **FAST)
    assert "var['cape_used'] not found" in caplog.text and "all 6 genes" in caplog.text


@pytest.mark.parametrize("tau", [-0.1, 1.0, 1.5, float("nan")])
def test_tau_outside_unit_interval_is_refused(tau: float) -> None:
    with pytest.raises(CapeInputError, match="tau"):
        causal_graph(_adata(), tau=tau, **FAST)


def test_nan_and_single_gene_are_refused() -> None:
    a = _adata()
    a.X[5, 2] = np.nan
    with pytest.raises(CapeInputError, match="NaN.*g2"):
        causal_graph(a, **FAST)
    s = _adata(sparse=True)
    s.X.data[0] = np.inf
    with pytest.raises(CapeInputError, match="NaN or infinite"):
        causal_graph(s, **FAST)
    with pytest.raises(CapeInputError, match="at least 2 non-constant genes"):
        causal_graph(_adata(m=1), **FAST)
    with pytest.raises(CapeInputError, match="rank"):
        causal_graph(_adata(), rank=0, **FAST)
    with pytest.raises(CapeInputError, match="use_genes"):
        causal_graph(_adata(), use_genes="nope", **FAST)
    for bad in (0, 2.5):
        with pytest.raises(CapeInputError, match="h_every must be a positive integer"):
            causal_graph(_adata(), h_every=bad, **FAST)


def test_cli_causal_round_trip(tmp_path) -> None:
    from cape.cli import main

    a = _adata()
    src, out = tmp_path / "in.h5ad", tmp_path / "out.h5ad"
    a.write_h5ad(src)
    code = main(["--quiet", "--device", "cpu", "causal", "--input", str(src), "--output", str(out),
                 "--rank", "dense", "--epochs", "2", "--tau", "0.1", "--h-every", "3"])
    assert code == 0
    b = ad.read_h5ad(out)
    assert b.varp["cape_dag"].shape == (6, 6) and is_dag(b.varp["cape_dag"].toarray())
    record = b.uns["cape"]["causal_graph"]
    assert record["h_every"] == 3 and record["params"]["h_every"] == 3
    with pytest.raises(SystemExit) as usage_error:  # argparse: one-line usage error, exit status 2
        main(["--quiet", "causal", "--input", str(src), "--output", str(tmp_path / "x.h5ad"), "--h-every", "0"])
    assert usage_error.value.code == 2
    assert main(["--quiet", "causal", "--input", str(src), "--output", str(tmp_path / "x.h5ad"),
                 "--tau", "1.2"]) == 2
    assert not (tmp_path / "x.h5ad").exists()


def test_simulate_sem_and_metrics() -> None:
    root_handlers = list(logging.getLogger().handlers)
    a = simulate_sem(8, 16, 200, graph="scale_free", sem="mlp", seed=2)
    assert torch.get_default_dtype() == torch.float32
    assert logging.getLogger().handlers == root_handlers  # gcastle's basicConfig undone
    assert a.shape == (200, 8) and a.X.dtype == np.float32
    T = a.varp["true_dag"].toarray()
    assert is_dag(T) and (T != 0).sum() > 0
    b = simulate_sem(8, 16, 200, graph="scale_free", sem="mlp", seed=2)
    np.testing.assert_array_equal(a.X, b.X)
    lin = simulate_sem(6, 8, 50, graph="erdos_renyi", sem="linear", seed=1)
    assert lin.uns["simulation"]["sem"] == "linear"
    perfect = dag_metrics(T, T)
    assert perfect["shd"] == 0 and perfect["f1"] == 1 and perfect["auprc"] == 1
    reversed_ = dag_metrics(T, T.T)
    assert reversed_["shd"] == (T != 0).sum() and reversed_["tpr"] == 0
    empty = dag_metrics(T, np.zeros_like(T))
    assert empty["f1"] == 0 and empty["nnz"] == 0
    with pytest.raises(CapeInputError):
        simulate_sem(5, 3, 10, graph="scale_free")
    with pytest.raises(CapeInputError):
        simulate_sem(5, 8, 10, sem="quadratic")


def test_divergence_is_reported_in_one_line() -> None:
    a = _adata()
    with pytest.raises(CapeInputError, match="diverged"):
        causal_graph(a, rank=None, lr=1e30, **FAST)
