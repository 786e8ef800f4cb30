"""cape.data.simulate_expression and `cape data simulate`: matrices shaped like real runs."""

from __future__ import annotations

import anndata as ad
import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from cape import CapeInputError
from cape.cli import main
from cape.data import simulate_expression


def test_umi_counts_are_sparse_integers_with_varying_depth():
    adata = simulate_expression(300, 2000, n_regulated=50, seed=1, chunk_cells=128)
    assert sp.isspmatrix_csr(adata.X) and adata.shape == (300, 2000)
    values = adata.X.data
    assert np.all(values == np.round(values)) and values.min() > 0
    detected = adata.X.nnz / (300 * 2000)
    assert 0.01 < detected < 0.5  # most entries are zero, as in 10x data
    library = np.asarray(adata.X.sum(axis=1)).ravel()
    assert library.std() / library.mean() > 0.2
    assert set(adata.obs["cell_type"].cat.categories) <= {f"type{i}" for i in range(5)}


def test_tpm_rows_sum_to_a_million():
    adata = simulate_expression(40, 500, kind="tpm", n_regulated=20, seed=0)
    assert isinstance(adata.X, np.ndarray)
    np.testing.assert_allclose(adata.X.sum(axis=1), 1e6, rtol=1e-4)
    assert np.any(adata.X != np.round(adata.X))


def test_true_dag_lies_on_the_regulated_genes():
    adata = simulate_expression(50, 400, n_regulated=30, edges_per_gene=2.0, seed=3)
    dag = adata.varp["true_dag"]
    assert dag.shape == (400, 400) and dag.nnz == 60
    rows, cols = dag.nonzero()
    regulated = adata.var["regulated"].to_numpy()
    assert regulated.sum() == 30 and regulated[rows].all() and regulated[cols].all()
    assert nx.is_directed_acyclic_graph(nx.from_scipy_sparse_array(dag, create_using=nx.DiGraph))


def test_same_seed_same_matrix():
    a = simulate_expression(64, 300, n_regulated=10, seed=7, chunk_cells=16)
    b = simulate_expression(64, 300, n_regulated=10, seed=7, chunk_cells=16)
    assert (a.X != b.X).nnz == 0
    c = simulate_expression(64, 300, n_regulated=10, seed=8, chunk_cells=16)
    assert (a.X != c.X).nnz > 0


@pytest.mark.parametrize("kwargs, words", [
    ({"kind": "smartseq"}, "kind must be one of"),
    ({"n_regulated": 5000}, "n_regulated must be in"),
    ({"n_cell_types": 0, "n_regulated": 5}, "n_cell_types must be"),
])
def test_bad_parameters_name_the_problem(kwargs, words):
    with pytest.raises(CapeInputError, match=words):
        simulate_expression(10, 100, **kwargs)


def test_cli_writes_the_matrix(tmp_path, capsys):
    out = tmp_path / "sim.h5ad"
    assert main(["--quiet", "data", "simulate", "-o", str(out), "--cells", "30", "--genes", "200",
                 "--regulated", "10"]) == 0
    adata = ad.read_h5ad(out)
    assert adata.shape == (30, 200) and adata.varp["true_dag"].nnz == 15
    assert "30 cells × 200 genes" in capsys.readouterr().out
