from __future__ import annotations

import importlib.util
import re

import anndata as ad
import numpy as np
import pandas as pd
import pytest

import cape
from cape import CapeInputError


def test_preprocess_counts(counts_adata):
    raw = counts_adata.X.copy()
    cape.pp.preprocess(counts_adata, min_genes=200, n_top_genes=50)
    np.testing.assert_array_equal(counts_adata.layers["counts"], raw)
    # normalised to 1e4 per cell, then log1p
    np.testing.assert_allclose(np.expm1(counts_adata.X).sum(axis=1), 1e4, rtol=1e-4)
    assert counts_adata.var["cape_used"].dtype == bool
    assert counts_adata.var["cape_used"].sum() == 50
    rec = counts_adata.uns["cape"]["preprocess"]
    assert rec["input_scale"] == "counts" and rec["normalised"] and rec["n_used"] == 50


def test_preprocess_qc_drops_sparse_cells(counts_adata):
    counts_adata.X[:10, 50:] = 0  # 10 cells with at most 50 detected genes
    out = cape.pp.preprocess(counts_adata, min_genes=100, n_top_genes=50, copy=True)
    assert out.n_obs == counts_adata.n_obs - 10
    assert "cape" not in counts_adata.uns  # copy=True leaves the input alone


def test_qc_removing_most_cells_asks_whether_the_table_is_transposed(counts_adata, caplog):
    counts_adata.X[:10, 50:] = 0
    with caplog.at_level("WARNING", logger="cape"):
        cape.pp.preprocess(counts_adata, min_genes=100, n_top_genes=50, copy=True)
    assert "transpose" not in caplog.text  # 10 of 300 removed: ordinary QC
    genes_by_cells = ad.AnnData(counts_adata.X.T.copy())  # 400 "cells" of 300 "genes"
    genes_by_cells.X[:300, 50:] = 0  # rows that are rarely detected genes: most fail QC
    with caplog.at_level("WARNING", logger="cape"):
        cape.pp.preprocess(genes_by_cells, min_genes=100, n_top_genes=50, copy=True)
    assert re.search(r"QC removed 3\d\d of 400 cells", caplog.text)
    assert ("if the rows of the input are genes, transpose it (cape reads cells × genes; "
            "cape preprocess --transpose)") in caplog.text


def test_already_log_normalised_is_not_normalised_twice(counts_adata, caplog):
    cape.pp.preprocess(counts_adata, n_top_genes=50)
    once = counts_adata.X.copy()
    with caplog.at_level("INFO", logger="cape"):
        cape.pp.preprocess(counts_adata, n_top_genes=50)
    assert "log-normalised already" in caplog.text
    np.testing.assert_array_equal(counts_adata.X, once)
    # without scanpy's marker, non-integer log-scale values are detected too
    del counts_adata.uns["log1p"]
    assert cape.pp.detect_scale(counts_adata) == "log"


def test_counts_put_back_after_log1p_are_counts(counts_adata):
    # scanpy's uns["log1p"] marker stays when a user resets X to the raw counts
    raw = counts_adata.X.copy()
    counts_adata.uns["log1p"] = {"base": None}
    with pytest.warns(UserWarning, match="uns\\['log1p'\\] is set but X holds whole numbers"):
        assert cape.pp.detect_scale(counts_adata) == "counts"
    with pytest.warns(UserWarning, match="whole numbers"):
        cape.pp.preprocess(counts_adata, n_top_genes=50)
    rec = counts_adata.uns["cape"]["preprocess"]
    assert rec["input_scale"] == "counts" and rec["normalised"]
    np.testing.assert_array_equal(counts_adata.layers["counts"], raw)
    np.testing.assert_allclose(np.expm1(counts_adata.X).sum(axis=1), 1e4, rtol=1e-4)
    # the marker with log-scale values, or with whole numbers no larger than 1, keeps meaning "log"
    binary = ad.AnnData(np.eye(4, dtype=np.float32), uns={"log1p": {"base": None}})
    assert cape.pp.detect_scale(binary) == "log"


@pytest.mark.parametrize("n_top_genes", [2000, None])
def test_every_gene_used_when_fewer_than_n_top(counts_adata, n_top_genes):
    cape.pp.preprocess(counts_adata, n_top_genes=n_top_genes)
    assert counts_adata.var["cape_used"].all()


def test_pbmc68k_reduced_default():
    adata = cape.data.load("pbmc68k_reduced")
    before = adata.X.copy()
    cape.pp.preprocess(adata)
    assert adata.uns["cape"]["preprocess"]["input_scale"] == "log"
    assert adata.n_obs == int((np.asarray((before > 0).sum(axis=1)).ravel() >= 200).sum())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"min_genes": 1000}, "min_genes=1000 exceeds the number of genes"),
        ({"min_genes": -1}, "min_genes must be ≥ 0"),
        ({"target_sum": 0}, "target_sum must be > 0"),
        ({"n_top_genes": 0}, "n_top_genes must be an integer ≥ 1 or None"),
        ({"n_top_genes": 2.5}, "n_top_genes must be an integer ≥ 1 or None"),
    ],
)
def test_bad_parameters(counts_adata, kwargs, message):
    with pytest.raises(CapeInputError, match=message):
        cape.pp.preprocess(counts_adata, **kwargs)


def test_seurat_v3_without_scikit_misc_is_refused_before_any_change(counts_adata, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "skmisc" else real(name, *a))
    before = counts_adata.X.copy()
    with pytest.raises(CapeInputError, match="needs scikit-misc, which is not installed: pip install scikit-misc"):
        cape.pp.preprocess(counts_adata, n_top_genes=50, hvg_flavor="seurat_v3")
    np.testing.assert_array_equal(counts_adata.X, before)
    assert "cape" not in counts_adata.uns


def test_no_cell_passes_qc(counts_adata):
    counts_adata.X[:, 100:] = 0
    with pytest.raises(CapeInputError, match="no cell has at least min_genes=200"):
        cape.pp.preprocess(counts_adata)


def test_negative_input_rejected(counts_adata):
    counts_adata.X[0, 0] = -1
    with pytest.raises(CapeInputError, match="negative values"):
        cape.pp.preprocess(counts_adata)


def _labelled(adata, targets: list[str]):
    """Half the cells control, the rest perturbed on ``targets`` in turn (GEARS labels in obs["condition"])."""
    n = adata.n_obs
    labels = ["ctrl"] * (n // 2) + [f"{targets[i % len(targets)]}+ctrl" for i in range(n - n // 2)]
    adata.obs["condition"] = labels
    return adata


def test_perturbed_genes_join_the_highly_variable_ones(counts_adata):
    counts_adata.X[:, 399] = 0  # never detected: constant, nothing to fit, so never used
    _labelled(counts_adata, ["G100", "G200", "G399", "G5"])
    hvg = cape.pp.preprocess(counts_adata, n_top_genes=50, copy=True)
    used_by_hvg = set(hvg.var_names[hvg.var["cape_used"]])
    out = cape.pp.preprocess(counts_adata, n_top_genes=50, interventions="condition", copy=True)
    used = set(out.var_names[out.var["cape_used"]])
    varying_targets = {"G100", "G200", "G5"}
    assert used == used_by_hvg | varying_targets and "G399" not in used
    assert (out.var["highly_variable"] == hvg.var["highly_variable"]).all()  # scanpy's selection is kept as it is
    rec = out.uns["cape"]["preprocess"]
    assert rec["params"]["interventions"] == "condition" and hvg.uns["cape"]["preprocess"]["params"][
        "interventions"] == "none"
    assert rec["targets"] == {"n_targets": 4, "n_added": len(varying_targets - used_by_hvg), "n_constant": 1}
    assert rec["n_used"] == len(used)


def test_min_cells_never_drops_a_perturbed_gene(counts_adata):
    counts_adata.X[:, 7] = 0
    counts_adata.X[:3, 7] = 1  # detected in 3 cells only
    _labelled(counts_adata, ["G7"])
    plain = cape.pp.preprocess(counts_adata, min_cells=10, n_top_genes=50, copy=True)
    kept = cape.pp.preprocess(counts_adata, min_cells=10, n_top_genes=50, interventions="condition", copy=True)
    assert "G7" not in plain.var_names and "G7" in kept.var_names and kept.var.loc["G7", "cape_used"]
    assert kept.n_vars == plain.n_vars + 1


@pytest.mark.parametrize(("labels", "match"), [
    (None, "no such column in adata.obs"),
    ("X+ctrl", "not in var_names, e.g. 'X'"),
    ("A+B+C", "not in GEARS format"),
])
def test_bad_perturbation_labels_stop_before_any_change(counts_adata, labels, match):
    if labels is not None:
        counts_adata.obs["condition"] = ["ctrl"] * 299 + [labels]
    before = counts_adata.X.copy()
    with pytest.raises(CapeInputError, match=match) as err:
        cape.pp.preprocess(counts_adata, n_top_genes=50, interventions="condition")
    assert "\n" not in str(err.value)
    np.testing.assert_array_equal(counts_adata.X, before)
    assert "cape" not in counts_adata.uns


def test_pearson_residuals_rank_the_raw_counts(counts_adata):
    counts_adata.X[:, 0] = 0  # never detected: constant, so not ranked
    out = cape.pp.preprocess(counts_adata, n_top_genes=50, hvg_flavor="pearson_residuals", copy=True)
    assert out.var["cape_used"].sum() == 50 and not out.var.loc["G0", "cape_used"]
    assert out.var["highly_variable"].sum() == 50
    assert out.var["cape_used"].iloc[1:40].sum() >= 35  # the genes raised in half the cells vary the most
    logged = counts_adata.copy()
    cape.pp.preprocess(logged, n_top_genes=50)
    del logged.layers["counts"]
    with pytest.raises(CapeInputError, match="needs raw counts"):
        cape.pp.preprocess(logged, n_top_genes=50, hvg_flavor="pearson_residuals")
    with pytest.raises(CapeInputError, match="hvg_flavor must be one of"):
        cape.pp.preprocess(counts_adata, hvg_flavor="dispersion")


def test_one_default_gene_count_for_the_api_the_cli_and_the_workflow():
    import argparse
    import inspect
    from pathlib import Path

    import yaml

    from cape.cli import build_parser
    from cape.pp._recipe import N_TOP_GENES

    assert inspect.signature(cape.pp.preprocess).parameters["n_top_genes"].default == N_TOP_GENES
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["preprocess"]
    assert sub.parse_args(["--input", "in.h5ad", "--output", "out.h5ad"]).n_top_genes == N_TOP_GENES
    configs = Path(__file__).resolve().parent.parent / "configs"
    schema = yaml.safe_load((configs / "schema.yaml").read_text())
    assert schema["properties"]["preprocess"]["properties"]["n_top_genes"]["default"] == N_TOP_GENES
    assert yaml.safe_load((configs / "config.yaml").read_text())["preprocess"]["n_top_genes"] == N_TOP_GENES


def _shallow(n_cells: int = 400, seed: int = 0) -> ad.AnnData:
    """Raw counts: 350 genes seen in a handful of cells, with bursts of counts there (the most variable), beside 250
    genes expressed evenly in every cell (so that every cell passes the default QC)."""
    rng = np.random.default_rng(seed)
    rare = rng.poisson(0.015, (n_cells, 350)) * rng.integers(1, 20, (n_cells, 350))
    even = rng.poisson(3.0, (n_cells, 250))
    X = np.hstack([rare, even]).astype(np.float32)
    return ad.AnnData(X, var=pd.DataFrame(index=[f"g{i}" for i in range(X.shape[1])]))


def test_used_genes_seen_in_a_few_cells_are_named_with_the_remedy(caplog):
    with caplog.at_level("WARNING", logger="cape"):
        cape.pp.preprocess(_shallow(), n_top_genes=100)
    match = re.search(r"the 100 genes used are detected in a median of ([\d.]+) of the 400 cells", caplog.text)
    assert match and float(match.group(1)) < 20 and "preprocess(min_cells=20)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="cape"):
        cape.pp.preprocess(_shallow(), n_top_genes=100, min_cells=20)  # the remedy silences it
    assert "detected in a median" not in caplog.text
