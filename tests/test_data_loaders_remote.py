"""The internet datasets' loaders, each run on a small local file in the original format via a file:// URL."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.io
import scipy.sparse as sp
import yaml

import cape
from cape import CapeInputError


def _point(folder: Path, name: str, urls: dict[str, str]) -> None:
    """Point the manifest's files (by role) at local URLs, keeping their archive members."""
    path = folder / f"{name}.yaml"
    m = yaml.safe_load(path.read_text())
    for f in m["files"]:
        f["url"] = urls[f["role"]]
        f["sha256"] = None
    path.write_text(yaml.safe_dump(m))


def test_new_manifests_are_shipped_and_valid():
    known = cape.data.manifests()
    for name, loader in (("zheng68k", "tenx_mtx_annotated"), ("segerstolpe_pancreas", "segerstolpe_pancreas"),
                         ("scope2_specht", "scp_csv"), ("pscope_leduc", "scp_csv")):
        assert known[name].loader == loader
        assert known[name].source["type"] == "url"
        assert known[name].keys["labels"] == "cell_type"
        assert known[name].license and known[name].citation


# ------------------------------------------------------------------------------------------------ 10x / Zheng
def _tenx_archive(tmp_path: Path) -> tuple[Path, Path, np.ndarray]:
    rng = np.random.default_rng(0)
    counts = rng.poisson(1.0, size=(6, 8)).astype(np.int64)  # cells × genes
    members = {}
    buf = io.BytesIO()
    scipy.io.mmwrite(buf, sp.coo_matrix(counts.T))  # matrix.mtx is genes × cells
    members["matrix.mtx"] = buf.getvalue()
    members["genes.tsv"] = "".join(f"ENSG{i:05d}\tGENE{i}\n" for i in range(8)).encode()
    members["barcodes.tsv"] = "".join(f"AAAC{i}-1\n" for i in range(6)).encode()
    archive = tmp_path / "fresh_68k.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(f"filtered_matrices_mex/hg19/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    labels = tmp_path / "68k_pbmc_barcodes_annotation.tsv"
    rows = [f"{x:.1f}\t{-x:.1f}\tAAAC{i}-1\t{'CD14+ Monocyte' if i % 2 else 'CD19+ B'}" for i, x in
            enumerate(rng.normal(size=5))]  # cell 5 has no label
    labels.write_text("TSNE.1\tTSNE.2\tbarcodes\tcelltype\n" + "\n".join(rows) + "\n")
    return archive, labels, counts


def test_zheng68k_loader_reads_10x_mtx_and_labels(tmp_path, manifest_folder):
    archive, labels, counts = _tenx_archive(tmp_path)
    _point(manifest_folder, "zheng68k", {"data": archive.as_uri(), "genes": archive.as_uri(),
                                         "barcodes": archive.as_uri(), "labels": labels.as_uri()})
    adata = cape.data.load("zheng68k")
    assert adata.shape == (5, 8)  # the unlabelled cell is dropped
    assert list(adata.var_names) == [f"GENE{i}" for i in range(8)]
    assert adata.var["gene_ids"].iloc[0] == "ENSG00000"
    np.testing.assert_array_equal(adata.X.toarray(), counts[:5])
    assert adata.obs["cell_type"].tolist() == ["CD19+ B", "CD14+ Monocyte"] * 2 + ["CD19+ B"]
    assert adata.uns["cape"]["dataset"]["keys"]["labels"] == "cell_type"


def test_zheng68k_annotation_without_celltype_column(tmp_path, manifest_folder):
    archive, labels, _ = _tenx_archive(tmp_path)
    labels.write_text("barcodes\tlabel\nAAAC0-1\tB\n")
    _point(manifest_folder, "zheng68k", {"data": archive.as_uri(), "genes": archive.as_uri(),
                                         "barcodes": archive.as_uri(), "labels": labels.as_uri()})
    with pytest.raises(CapeInputError, match="annotation table lacks a 'celltype' column"):
        cape.data.load("zheng68k")


# ------------------------------------------------------------------------------------------------ Segerstolpe
def _segerstolpe(tmp_path: Path) -> tuple[Path, Path, np.ndarray]:
    rng = np.random.default_rng(1)
    cells = [f"HP1502401_{c}" for c in "ABCDE"]
    genes = ["INS", "GCG", "SST", "INS", "KRT19"]  # INS twice (two RefSeq ids): summed
    rpkm = rng.gamma(1.0, 10.0, size=(5, 5)).round(3)
    counts = rng.poisson(20, size=(5, 5))
    lines = ["#samples\t" + "\t".join(cells)]
    for i, g in enumerate(genes):
        lines.append("\t".join([g, f"NM_{i:06d}", *map(str, rpkm[i]), *map(str, counts[i])]))
    data = tmp_path / "pancreas_refseq_rpkms_counts_3514sc.txt"
    data.write_text("\n".join(lines) + "\n")
    sdrf = pd.DataFrame({
        "Source Name": cells,
        "Characteristics[individual]": ["HP1502401"] * 3 + ["H2"] * 2,
        "Characteristics[disease]": ["normal"] * 3 + ["type II diabetes mellitus"] * 2,
        "Characteristics[cell type]": ["beta cell", "alpha cell", "delta cell", "beta cell", "ductal cell"],
        "Characteristics[single cell well quality]": ["OK", "OK", "low quality cell", "OK", "OK"],
    })
    meta = tmp_path / "E-MTAB-5061.sdrf.txt"
    sdrf.to_csv(meta, sep="\t", index=False)
    return data, meta, counts


def test_segerstolpe_loader_uses_counts_and_quality_flag(tmp_path, manifest_folder):
    data, meta, counts = _segerstolpe(tmp_path)
    _point(manifest_folder, "segerstolpe_pancreas", {"data": data.as_uri(), "meta": meta.as_uri()})
    adata = cape.data.load("segerstolpe_pancreas")
    assert list(adata.obs_names) == ["HP1502401_A", "HP1502401_B", "HP1502401_D", "HP1502401_E"]
    assert list(adata.var_names) == ["INS", "GCG", "SST", "KRT19"]
    keep = [0, 1, 3, 4]
    np.testing.assert_array_equal(adata[:, "INS"].X.toarray().ravel(), (counts[0] + counts[3])[keep])
    np.testing.assert_array_equal(adata[:, "KRT19"].X.toarray().ravel(), counts[4][keep])
    assert adata.obs["cell_type"].tolist() == ["beta cell", "alpha cell", "beta cell", "ductal cell"]
    assert adata.obs["donor"].tolist() == ["HP1502401", "HP1502401", "H2", "H2"]
    assert "counts" in adata.layers


def test_segerstolpe_rejects_wrong_layout(tmp_path, manifest_folder):
    data, meta, _ = _segerstolpe(tmp_path)
    data.write_text("gene\tcell1\nINS\t3\n")
    _point(manifest_folder, "segerstolpe_pancreas", {"data": data.as_uri(), "meta": meta.as_uri()})
    with pytest.raises(CapeInputError, match="does not start with '#samples'"):
        cape.data.load("segerstolpe_pancreas")


# ------------------------------------------------------------------------------------------------ proteomics
def test_scope2_specht_protein_table_with_cells_as_columns(tmp_path, manifest_folder):
    rng = np.random.default_rng(2)
    cells = [f"i{i}" for i in range(8)]
    values = rng.normal(size=(4, 8)).round(4)
    data = pd.DataFrame(values, columns=cells)
    data.insert(0, "protein", ["P1", "P2", "P3", "P4"])
    data_path = tmp_path / "Proteins-processed.csv"
    data.to_csv(data_path, index=False)
    annotation = pd.DataFrame([["sc_m0", "sc_u"] * 4, ["b1"] * 4 + ["b2"] * 4], index=["celltype", "batch_chroma"],
                              columns=cells)
    cells_path = tmp_path / "Cells.csv"
    annotation.to_csv(cells_path)
    _point(manifest_folder, "scope2_specht", {"data": data_path.as_uri(), "cells": cells_path.as_uri()})
    adata = cape.data.load("scope2_specht")
    assert adata.shape == (8, 4)
    np.testing.assert_allclose(adata.X, values.T, rtol=1e-6)
    assert adata.obs["cell_type"].tolist() == ["macrophage", "monocyte"] * 4
    assert adata.obs["batch_chroma"].tolist() == ["b1"] * 4 + ["b2"] * 4
    assert adata.uns["scp"]["observed_fraction"] == 1.0
    assert adata.X.min() < 0  # log-ratios stay signed


def test_pscope_leduc_peptides_with_missing_values(tmp_path, manifest_folder):
    rng = np.random.default_rng(3)
    cells = [f"i{i}" for i in range(12)]
    pep = rng.normal(size=(5, 12))
    pep[0, 2] = np.nan
    pep[4, :] = np.nan
    pep[4, 0] = 1.0  # P4 is seen in 1 of 12 cells (8 % < 10 %): dropped
    data = pd.DataFrame(pep, columns=cells)
    data.insert(0, "Peptide", ["AAK_2", "LLR_2", "GGK_3", "TTR_2", "QQK_2"])
    data.insert(0, "Protein", ["P1", "P1", "P2", "P3", "P4"])
    data_path = tmp_path / "pSCoPE_Leduc_data.csv"
    data.to_csv(data_path, index=False, na_rep="NA")
    cells_path = tmp_path / "pSCoPE_Leduc_cells.csv"
    pd.DataFrame({"cell_type": ["U-937(pSCoPE_Leduc)", "Melanoma(pSCoPE_Leduc)"] * 6},
                 index=cells).to_csv(cells_path)
    _point(manifest_folder, "pscope_leduc", {"data": data_path.as_uri(), "cells": cells_path.as_uri()})
    adata = cape.data.load("pscope_leduc")
    assert list(adata.var_names) == ["P1", "P2", "P3"]
    assert np.isfinite(adata.X).all()
    # P1 = median of its two peptides (where one is missing, the other one).
    expected_p1 = np.nanmedian(pep[:2], axis=0)
    np.testing.assert_allclose(adata[:, "P1"].X.ravel(), expected_p1, rtol=1e-5)
    assert adata.layers["observed"].all()  # P1 is observed everywhere through its second peptide
    assert set(adata.obs["cell_type"]) == {"U-937(pSCoPE_Leduc)", "Melanoma(pSCoPE_Leduc)"}


def test_scp_imputes_missing_protein_values(tmp_path, manifest_folder):
    rng = np.random.default_rng(4)
    cells = [f"c{i}" for i in range(10)]
    values = rng.normal(size=(3, 10))
    values[1, 4] = np.nan
    data = pd.DataFrame(values, columns=cells)
    data.insert(0, "protein", ["P1", "P2", "P3"])
    data_path = tmp_path / "d.csv"
    data.to_csv(data_path, index=False, na_rep="NA")
    cells_path = tmp_path / "c.csv"
    pd.DataFrame({"celltype": ["a", "b"] * 5}, index=cells).to_csv(cells_path)
    _point(manifest_folder, "pscope_leduc", {"data": data_path.as_uri(), "cells": cells_path.as_uri()})
    adata = cape.data.load("pscope_leduc")
    assert adata.layers["observed"][4, 1] == 0 and adata.layers["observed"].sum() == 29
    assert np.isfinite(adata.X[4, 1])
    np.testing.assert_allclose(np.delete(adata.X[:, 1], 4), np.delete(values[1], 4), rtol=1e-6)
    assert adata.uns["scp"]["observed_fraction"] == pytest.approx(29 / 30)


def test_scp_annotation_without_cell_type(tmp_path, manifest_folder):
    data_path = tmp_path / "d.csv"
    pd.DataFrame({"protein": ["P1"], "c1": [0.1], "c2": [0.2]}).to_csv(data_path, index=False)
    cells_path = tmp_path / "c.csv"
    pd.DataFrame({"batch": ["x", "y"]}, index=["c1", "c2"]).to_csv(cells_path)
    _point(manifest_folder, "pscope_leduc", {"data": data_path.as_uri(), "cells": cells_path.as_uri()})
    with pytest.raises(CapeInputError, match="no cell type field"):
        cape.data.load("pscope_leduc")
