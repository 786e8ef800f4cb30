from __future__ import annotations

import anndata as ad
import numpy as np
import pytest

import cape
from cape import CapeInputError


def test_read_h5ad_roundtrip(tmp_path, counts_adata):
    path = tmp_path / "x.h5ad"
    counts_adata.write_h5ad(path)
    back = cape.data.read(path)
    assert back.shape == counts_adata.shape
    np.testing.assert_array_equal(back.X, counts_adata.X)


def test_read_csv_cells_by_genes(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text(",g1,g2,g3\ncellA,1,0,2\ncellB,0,3,1\n")
    adata = cape.data.read(path)
    assert adata.shape == (2, 3)
    assert list(adata.var_names) == ["g1", "g2", "g3"]
    assert list(adata.obs_names) == ["cellA", "cellB"]


def test_read_csv_in_chunks_keeps_raw_counts_sparse(tmp_path, monkeypatch):
    import importlib

    import scipy.sparse as sp

    reader = importlib.import_module("cape.data.user_files")  # the module (cape.data.read is also the function)
    rng = np.random.default_rng(0)
    counts = rng.poisson(0.2, size=(7, 40)) * (rng.random((7, 40)) < 0.5)
    lines = [",".join(["", *(f"g{j}" for j in range(40))])]
    lines += [",".join([f"c{i}", *map(str, row)]) for i, row in enumerate(counts)]
    path = tmp_path / "umi.csv"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(reader, "CSV_CHUNK_ROWS", 3)  # 3 + 3 + 1 rows
    adata = cape.data.read(path)
    assert sp.issparse(adata.X) and adata.X.dtype == np.float32
    np.testing.assert_array_equal(adata.X.toarray(), counts)
    assert list(adata.obs_names) == [f"c{i}" for i in range(7)]
    dense = tmp_path / "tpm.csv"
    dense.write_text(",g1,g2\ncellA,1.5,2\ncellB,3,0.25\ncellC,1,1\n")
    tpm = cape.data.read(dense)
    assert isinstance(tpm.X, np.ndarray) and tpm.X.tolist() == [[1.5, 2], [3, 0.25], [1, 1]]


def test_read_csv_non_numeric_column(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text(",g1,g2\ncellA,1,x\n")
    with pytest.raises(CapeInputError, match="'g2' is not numeric"):
        cape.data.read(path)


def test_read_loom_keeps_gene_and_cell_names(tmp_path, counts_adata):
    loompy = pytest.importorskip("loompy")
    path = tmp_path / "x.loom"
    counts_adata.write_loom(path)  # anndata's attributes: var_names / obs_names
    read = cape.data.read(path)
    assert read.shape == counts_adata.shape
    assert list(read.var_names) == list(counts_adata.var_names) and list(read.obs_names) == list(counts_adata.obs_names)
    np.testing.assert_array_equal(read.X.toarray(), counts_adata.X)
    genes, cells = np.asarray(counts_adata.var_names), np.asarray(counts_adata.obs_names)
    loompy.create(str(tmp_path / "native.loom"), counts_adata.X.T, {"Gene": genes}, {"CellID": cells})  # loompy's
    native = cape.data.read(tmp_path / "native.loom")
    assert list(native.var_names) == list(genes) and list(native.obs_names) == list(cells)
    loompy.create(str(tmp_path / "unnamed.loom"), counts_adata.X.T, {"Symbol_x": genes}, {"CellID": cells})
    with pytest.raises(CapeInputError, match="no gene names in the loom file .*it has Symbol_x"):
        cape.data.read(tmp_path / "unnamed.loom")


def test_obs_columns_are_read_without_the_matrix(tmp_path, counts_adata):
    from cape.data.user_files import check_obs_columns, obs_columns

    counts_adata.obs["batch"] = "b1"
    counts_adata.write_h5ad(tmp_path / "x.h5ad")
    assert obs_columns(tmp_path / "x.h5ad") == ["group", "batch"]
    check_obs_columns(tmp_path / "x.h5ad", {"labels": "group"})
    with pytest.raises(CapeInputError, match="labels=grup: no such column in .*x.h5ad; its cell annotation columns: "
                                             "group, batch"):
        check_obs_columns(tmp_path / "x.h5ad", {"labels": "grup"})
    (tmp_path / "m.csv").write_text(",g1\ncellA,1\n")
    with pytest.raises(CapeInputError, match="none \\(a .csv file carries no cell annotations\\)"):
        check_obs_columns(tmp_path / "m.csv", {"labels": "group"})
    (tmp_path / "broken.h5ad").write_text("not hdf5")
    assert obs_columns(tmp_path / "broken.h5ad") is None  # reading it says what is wrong
    check_obs_columns(tmp_path / "broken.h5ad", {"labels": "group"})
    assert obs_columns(tmp_path / "x.zarr") is None


def test_missing_file(tmp_path):
    with pytest.raises(CapeInputError, match="input file not found"):
        cape.data.read(tmp_path / "nope.h5ad")


def test_text_file_named_h5ad(tmp_path):
    path = tmp_path / "fake.h5ad"
    path.write_text("this is not hdf5\n")
    with pytest.raises(CapeInputError, match=r"cannot read .*fake\.h5ad as \.h5ad") as info:
        cape.data.read(path)
    assert "\n" not in str(info.value)


def test_unsupported_suffix(tmp_path):
    path = tmp_path / "x.xlsx"
    path.write_text("")
    with pytest.raises(CapeInputError, match="unsupported file type .xlsx"):
        cape.data.read(path)


@pytest.mark.parametrize("shape, what", [((0, 5), "0 cells"), ((5, 0), "0 genes")])
def test_empty(tmp_path, shape, what):
    path = tmp_path / "e.h5ad"
    ad.AnnData(np.zeros(shape, dtype=np.float32)).write_h5ad(path)
    with pytest.raises(CapeInputError, match=what):
        cape.data.read(path)


@pytest.mark.parametrize("bad, word", [(np.nan, "NaN"), (np.inf, "inf")])
def test_non_finite(tmp_path, counts_adata, bad, word):
    counts_adata.X[3, 7] = bad
    path = tmp_path / "nf.h5ad"
    counts_adata.write_h5ad(path)
    with pytest.raises(CapeInputError, match=f"X contains {word} values .*cell 'c3', gene 'G7'"):
        cape.data.read(path)


def test_non_finite_sparse(counts_adata):
    import scipy.sparse as sp

    counts_adata.X[0, 0] = np.nan
    counts_adata.X = sp.csr_matrix(counts_adata.X)
    with pytest.raises(CapeInputError, match="NaN"):
        cape.data.validate_adata(counts_adata)


def test_negative_counts(tmp_path, counts_adata):
    counts_adata.X[1, 1] = -3
    path = tmp_path / "neg.h5ad"
    counts_adata.write_h5ad(path)
    with pytest.raises(CapeInputError, match="negative values"):
        cape.data.read(path)
    # A scaled matrix (scanpy's pp.scale bookkeeping) may be negative, or the caller can say so.
    assert cape.data.read(path, expect_counts=False).shape == counts_adata.shape


def test_duplicated_gene_names_made_unique(tmp_path, counts_adata):
    names = list(counts_adata.var_names)
    names[5] = names[4]
    counts_adata.var_names = names
    path = tmp_path / "dup.h5ad"
    counts_adata.write_h5ad(path)
    with pytest.warns(UserWarning, match="1 duplicated gene names .*G4.*made unique") as record:
        adata = cape.data.read(path)
    assert len(record) == 1  # cape's warning only, not anndata's advice to do what cape has done
    assert adata.var_names.is_unique
    assert "G4-1" in adata.var_names


def _write_10x_h5(path, x: np.ndarray, genes: list[str]) -> None:
    """A Cell Ranger v3 filtered_feature_bc_matrix.h5 (CSC genes × cells) written with h5py."""
    import h5py
    import scipy.sparse as sp

    m = sp.csc_matrix(x.T.astype(np.int32))
    with h5py.File(path, "w") as f:
        g = f.create_group("matrix")
        g["barcodes"] = np.array([f"AAAC{i:04d}-1" for i in range(x.shape[0])], dtype="S")
        g["data"], g["indices"], g["indptr"] = m.data, m.indices, m.indptr
        g["shape"] = np.array(m.shape, dtype=np.int32)
        feats = g.create_group("features")
        feats["id"] = np.array([f"ENSG{i:05d}" for i in range(len(genes))], dtype="S")
        feats["name"] = np.array(genes, dtype="S")
        feats["feature_type"] = np.array(["Gene Expression"] * len(genes), dtype="S")
        feats["genome"] = np.array(["GRCh38"] * len(genes), dtype="S")
        feats["_all_tag_keys"] = np.array([b"genome"])


def test_read_10x_h5_with_duplicated_symbols(tmp_path):
    x = np.random.default_rng(0).poisson(1.0, size=(20, 6))
    path = tmp_path / "filtered_feature_bc_matrix.h5"
    _write_10x_h5(path, x, ["A", "B", "C", "C", "D", "E"])
    with pytest.warns(UserWarning, match="duplicated gene names"):
        adata = cape.data.read(path)
    assert adata.shape == (20, 6)
    assert adata.var_names.is_unique
    np.testing.assert_array_equal(adata.X.toarray(), x)
