"""cape.data.orientation: genes × cells tables are refused, real cells × genes matrices never are."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp

import cape
from cape import CapeInputError
from cape.cli import main
from cape.data.orientation import rows_look_like_genes


def _neutral(adata: ad.AnnData) -> ad.AnnData:
    """The same matrix with names that say nothing (``r0``, ``v0``), so that only the totals can tell."""
    out = adata.copy()
    out.obs_names = [f"r{i}" for i in range(out.n_obs)]
    out.var_names = [f"v{i}" for i in range(out.n_vars)]
    return out


@pytest.fixture(scope="module")
def umi() -> ad.AnnData:
    return cape.data.simulate_expression(600, 1500, seed=1)


@pytest.fixture(scope="module")
def wide() -> ad.AnnData:
    """A 10x-shaped raw count matrix: 33,000 genes, fewer cells than genes."""
    return cape.data.simulate_expression(300, 33_000, seed=2)


@pytest.fixture(scope="module")
def tpm() -> ad.AnnData:
    return cape.data.simulate_expression(200, 5000, kind="tpm", seed=3)


@pytest.fixture(scope="module")
def pbmc() -> ad.AnnData:
    return cape.data.load("pbmc68k_reduced")


@pytest.mark.parametrize("name", ["umi", "wide", "tpm", "pbmc"])
def test_cells_by_genes_is_never_refused(request, name):
    adata = request.getfixturevalue(name)
    assert rows_look_like_genes(adata) is None
    assert rows_look_like_genes(_neutral(adata)) is None


@pytest.mark.parametrize("name", ["umi", "wide", "tpm", "pbmc"])
def test_genes_by_cells_is_told_by_its_names(request, name):
    flipped = request.getfixturevalue(name).T.copy()
    assert "look like genes" in rows_look_like_genes(flipped)


@pytest.mark.parametrize("name", ["umi", "wide", "tpm"])
def test_genes_by_cells_is_told_by_its_totals(request, name):
    flipped = _neutral(request.getfixturevalue(name).T.copy())
    assert "decades" in rows_look_like_genes(flipped)


def test_empty_droplets_do_not_make_cells_look_like_genes(wide):
    unfiltered = _neutral(wide)
    x = unfiltered.X.tolil()
    x[: unfiltered.n_obs // 5] = 0  # a fifth of the barcodes empty, as in an unfiltered 10x matrix
    unfiltered.X = x.tocsr()
    assert rows_look_like_genes(unfiltered) is None
    assert rows_look_like_genes(_neutral(unfiltered.T.copy())) is not None


def test_names_of_cells_in_the_rows_win_over_totals(umi):
    flipped = _neutral(umi.T.copy())
    flipped.obs_names = [f"AAACCTGAGAAGGCC{i % 10}-{i}" for i in range(flipped.n_obs)]  # barcodes: rows are cells
    assert rows_look_like_genes(flipped) is None


def test_ensembl_rows_beside_barcode_columns():
    rng = np.random.default_rng(0)
    adata = ad.AnnData(rng.poisson(2.0, size=(30, 40)).astype(np.float32))
    adata.obs_names = [f"ENSG{i:011d}" for i in range(30)]
    adata.var_names = [f"{'ACGT' * 4}-{i}" for i in range(40)]
    assert rows_look_like_genes(adata) is not None
    adata.obs_names = [f"SYMB{i}" for i in range(30)]  # symbols beside barcodes
    assert rows_look_like_genes(adata) is not None


def test_preprocess_raises(umi):
    with pytest.raises(CapeInputError, match=r"looks like genes × cells .*cape preprocess --transpose"):
        cape.pp.preprocess(umi.T.copy())


def test_cli_refuses_a_genes_by_cells_csv_and_reads_it_transposed(umi, tmp_path, capsys):
    small = umi[:300, :400].copy()
    small = small[:, np.asarray(small.X.sum(0)).ravel() > 0].copy()
    csv, out = tmp_path / "genes_as_rows.csv", tmp_path / "out.h5ad"
    small.T.to_df().to_csv(csv)
    assert main(["--quiet", "preprocess", "-i", str(csv), "-o", str(out), "--min-genes", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cape: error: ") and "--transpose" in err[0]
    assert not out.exists()
    assert main(["--quiet", "preprocess", "-i", str(csv), "-o", str(out), "--min-genes", "10", "--transpose"]) == 0
    assert ad.read_h5ad(out).obs_names[0].startswith("cell")


def test_read_transposes(umi, tmp_path):
    path = tmp_path / "flipped.h5ad"
    umi.T.copy().write_h5ad(path)
    back = cape.data.read(path, transpose=True)
    assert back.shape == umi.shape and sp.issparse(back.X) and back.X.format == "csr"
    assert list(back.obs_names[:3]) == list(umi.obs_names[:3])
