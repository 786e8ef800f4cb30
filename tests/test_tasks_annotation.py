from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest

from cape import CapeInputError
from cape.tasks.annotation import (
    annotation_metrics,
    annotation_split,
    logistic_regression_pca,
)
from cape.tasks.labels import checked_labels
from cape_benchmarks.baselines import run_annotation_baselines


def _blobs(sizes=(40, 30, 20), n_genes=12, sep=3.0, seed=0) -> ad.AnnData:
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, sep, size=(len(sizes), n_genes))
    x = np.vstack([c + rng.normal(size=(n, n_genes)) for c, n in zip(centres, sizes, strict=True)])
    labels = np.repeat([f"type{i}" for i in range(len(sizes))], sizes)
    return ad.AnnData(np.abs(x).astype(np.float32), obs=pd.DataFrame({"cell_type": pd.Categorical(labels)},
                                                                     index=[f"c{i}" for i in range(len(labels))]))


@pytest.mark.parametrize("seed", [0, 1, 5])
def test_split_is_stratified_30_70_and_seeded(seed):
    labels = np.repeat(["a", "b", "c"], [50, 30, 20])
    split = annotation_split(labels, seed=seed)
    assert len(split.fine_tune) == 30 and len(split.test) == 70
    assert sorted(np.concatenate([split.fine_tune, split.test]).tolist()) == list(range(100))
    ft = pd.Series(labels[split.fine_tune]).value_counts()
    assert ft.to_dict() == {"a": 15, "b": 9, "c": 6}  # proportional to the classes
    again = annotation_split(labels, seed=seed)
    np.testing.assert_array_equal(split.fine_tune, again.fine_tune)
    other = annotation_split(labels, seed=seed + 100)
    assert not np.array_equal(split.fine_tune, other.fine_tune)


def test_metrics_brute_force():
    y = np.array(list("aaabbc"))
    p = np.array(list("aabbbb"))
    m = annotation_metrics(y, p)
    assert m["accuracy"] == pytest.approx(4 / 6)
    # per-class F1: a: P=1, R=2/3 → 0.8; b: P=2/4, R=1 → 2/3; c: 0
    assert m["macro_f1"] == pytest.approx((0.8 + 2 / 3 + 0) / 3)
    assert annotation_metrics(y, y) == {"accuracy": 1.0, "macro_f1": 1.0}


def test_logreg_pca_separates_blobs_and_is_deterministic():
    adata = _blobs()
    a = logistic_regression_pca(adata, "cell_type", seed=0, n_comps=5)
    b = logistic_regression_pca(adata, "cell_type", seed=0, n_comps=5)
    assert a["accuracy"] > 0.95 and a["macro_f1"] > 0.95
    assert (a["accuracy"], a["macro_f1"]) == (b["accuracy"], b["macro_f1"])
    assert a["n_fine_tune"] + a["n_test"] == adata.n_obs


def test_run_records():
    recs = run_annotation_baselines(_blobs(), "cell_type", dataset="blobs", seeds=(0, 1), n_comps=5)
    assert len(recs) == 4
    assert {r["metric"] for r in recs} == {"accuracy", "macro_f1"}
    assert {r["seed"] for r in recs} == {0, 1}


# ---------------------------------------------------------------------------------------------- bad input
def test_missing_label_key():
    with pytest.raises(CapeInputError, match=r"label key obs\['celltype'\] not found; obs columns: cell_type"):
        logistic_regression_pca(_blobs(), "celltype")


def test_single_class():
    adata = _blobs()
    adata.obs["cell_type"] = "T"
    with pytest.raises(CapeInputError, match="1 class"):
        logistic_regression_pca(adata, "cell_type")


def test_class_with_one_cell_excluded_with_warning():
    adata = _blobs()
    labels = adata.obs["cell_type"].astype(str).to_numpy()
    labels[0] = "rare"
    adata.obs["cell_type"] = labels
    with pytest.warns(UserWarning, match="fewer than 2 cells excluded: rare"):
        kept = checked_labels(adata, "cell_type")
    assert "rare" not in set(kept) and len(kept) == adata.n_obs - 1
    with pytest.warns(UserWarning, match="rare"):
        res = logistic_regression_pca(adata, "cell_type", n_comps=5)
    assert res["n_fine_tune"] + res["n_test"] == adata.n_obs - 1


def test_dataset_too_small_for_the_split():
    labels = ["a", "a", "b", "b", "c", "c"]  # 30 % of 6 cells = 1 cell for 3 classes
    with pytest.raises(CapeInputError, match="too small for the 30%/70% split"):
        annotation_split(labels)


def test_cells_without_a_label_are_left_out_and_no_labels_is_an_error():
    adata = _blobs()
    adata.obs["cell_type"] = adata.obs["cell_type"].astype(object)
    adata.obs.iloc[3, 0] = np.nan
    with pytest.warns(UserWarning, match="1 cell\\(s\\) without a label left out"):
        labels = checked_labels(adata, "cell_type")
    assert adata.obs_names[3] not in labels.index and len(labels) == adata.n_obs - 1
    assert "nan" not in set(labels)
    adata.obs["cell_type"] = np.nan
    with pytest.raises(CapeInputError, match="has no labels: all"):
        checked_labels(adata, "cell_type")
