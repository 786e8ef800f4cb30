"""cape.tl.annotate / cluster / predict_perturbation: the fields they set, their metrics and bad input."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from _models_data import one_thread  # noqa: F401  (fixture)

import cape
from cape import CapeInputError
from cape._settings import PROGRESS
from cape.data.perturbation_data import simulate_perturbation
from cape.tasks.clustering import clustering_metrics
from cape.tasks.perturbation_predictors import pca_gene_embeddings

pytestmark = pytest.mark.usefixtures("one_thread")  # shared fixture from _models_data


@pytest.fixture
def labelled() -> ad.AnnData:
    rng = np.random.default_rng(1)
    x = rng.poisson(1.0, size=(60, 20)).astype(np.float32)
    x[30:, :5] += rng.poisson(5.0, size=(30, 5))
    adata = ad.AnnData(np.log1p(x))
    adata.obs_names = [f"c{i}" for i in range(60)]
    adata.var_names = [f"G{i}" for i in range(20)]
    adata.obs["cell_type"] = pd.Categorical(np.repeat(["a", "b"], 30))
    return adata


SMALL = {"d_model": 8, "n_layers": 1, "n_heads": 2, "max_len": 16, "device": "cpu"}


def test_annotate_sets_split_predictions_and_metrics(labelled):
    assert cape.tl.annotate(labelled, "cell_type", encoding="trainable_absolute", model_kwargs=SMALL,
                            pretrain_epochs=1, epochs=1, seed=0) is None  # scanpy style: in place
    metrics = labelled.uns["cape"]["annotate"]["metrics"]
    split = labelled.obs["cape_split"].astype(str)
    assert (split == "fine_tune").sum() == 18 and (split == "test").sum() == 42
    assert set(labelled.obs["cape_prediction"].astype(str)) <= {"a", "b"}
    test = split == "test"
    expected = np.mean(labelled.obs["cape_prediction"].astype(str)[test] == labelled.obs["cell_type"].astype(str)[test])
    assert metrics["accuracy"] == pytest.approx(expected)
    assert metrics["n_test"] == 42
    assert metrics["n_fine_tune"] == 18


def test_annotate_says_when_it_pretrains_and_takes_a_pretrained_model(labelled, caplog):
    with caplog.at_level(PROGRESS, logger="cape"):
        cape.tl.annotate(labelled, "cell_type", encoding="none", model_kwargs=SMALL, pretrain_epochs=2, epochs=1,
                         seed=0)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("annotate: pretraining")]
    assert said == ["annotate: pretraining 2 epochs on all 60 cells before fine-tuning; pass pretrain_epochs=0 to "
                    "skip, or model= an already pretrained CellTransformer"]
    assert labelled.uns["cape"]["annotate"]["params"]["pretrain_epochs"] == 2
    caplog.clear()
    model = cape.models.CellTransformer(labelled, encoding="none", seed=0, **SMALL)
    model.pretrain(labelled, epochs=1)
    pretrained = model.history["pretrain"]
    with caplog.at_level(PROGRESS, logger="cape"):
        cape.tl.annotate(labelled, "cell_type", model=model, epochs=1, seed=0)
    assert not [r for r in caplog.records if r.getMessage().startswith("annotate: pretraining")]
    assert model.history["pretrain"] is pretrained and len(model.history["train"]) == 1  # fine-tuned, not pretrained
    assert labelled.uns["cape"]["annotate"]["params"]["pretrain_epochs"] == 0
    assert set(labelled.obs["cape_prediction"].astype(str)) <= {"a", "b"}


def test_annotate_copy_leaves_input_alone(labelled):
    out = cape.tl.annotate(labelled, "cell_type", encoding="none", model_kwargs=SMALL, pretrain_epochs=0, epochs=1,
                           seed=0, copy=True)
    assert "cape_prediction" in out.obs and "cape_prediction" not in labelled.obs
    assert "accuracy" in out.uns["cape"]["annotate"]["metrics"]


def test_annotate_bad_labels(labelled):
    with pytest.raises(CapeInputError, match=r"obs\['celltype'\] not found"):
        cape.tl.annotate(labelled, "celltype", encoding="none")
    one = labelled.copy()
    one.obs["cell_type"] = "a"
    with pytest.raises(CapeInputError, match="at least 2"):
        cape.tl.annotate(one, "cell_type", encoding="none")


def test_cells_without_a_label_are_left_out_of_the_scores(labelled):
    labelled.obs["cell_type"] = labelled.obs["cell_type"].astype(object)
    labelled.obs.iloc[[0, 1, 59], 0] = np.nan
    with pytest.warns(UserWarning, match="3 cell\\(s\\) without a label left out"):
        cape.tl.annotate(labelled, "cell_type", encoding="none", model_kwargs=SMALL, pretrain_epochs=0, epochs=1,
                         seed=0)
    split = labelled.obs["cape_split"].astype(str)
    assert (split.iloc[[0, 1, 59]] == "unused").all()
    assert labelled.uns["cape"]["annotate"]["metrics"]["n_test"] == (split == "test").sum() > 0
    assert labelled.obs["cape_prediction"].notna().all()  # every cell still gets a prediction
    labelled.obsm["X_cape"] = np.random.default_rng(0).normal(size=(60, 4))
    with pytest.warns(UserWarning, match="without a label"):
        cape.tl.cluster(labelled, "cell_type", seed=0)
    assert labelled.uns["cape"]["cluster"]["metrics"]["k"] == 2 and labelled.obs["cape_cluster"].size == 60


def test_cluster_matches_the_bench_metrics(labelled):
    rng = np.random.default_rng(0)
    labelled.obsm["X_cape"] = rng.normal(size=(60, 4)) + 3.0 * (labelled.obs["cell_type"] == "b").to_numpy()[:, None]
    assert cape.tl.cluster(labelled, "cell_type", seed=0) is None
    metrics = labelled.uns["cape"]["cluster"]["metrics"]
    clusters = labelled.obs["cape_cluster"].astype(int).to_numpy()
    ref = clustering_metrics(labelled.obsm["X_cape"], labelled.obs["cell_type"].to_numpy(), clusters)
    assert metrics == {"k": 2, **ref}
    assert metrics["ARI"] > 0.9  # well-separated groups are found
    only_k = cape.tl.cluster(labelled, n_clusters=3, key_added="k3", seed=0, copy=True)
    # Another key_added keeps its own record: the default run's stays as it was.
    assert only_k.uns["cape"]["k3"]["metrics"] == {"k": 3} and only_k.obs["k3"].nunique() == 3
    assert only_k.uns["cape"]["cluster"]["metrics"] == metrics
    assert "k3" not in labelled.obs


def test_cluster_bad_input(labelled):
    with pytest.raises(CapeInputError, match=r"obsm\['X_cape'\] not found"):
        cape.tl.cluster(labelled, "cell_type")
    labelled.obsm["X_cape"] = np.zeros((60, 2))
    with pytest.raises(CapeInputError, match="n_clusters or a label_key"):
        cape.tl.cluster(labelled)


def test_predict_perturbation_writes_predictions_and_baselines(tmp_path):
    adata = simulate_perturbation(n_genes=16, n_edges=24, n_control=60, n_cells_per_perturbation=8, n_single=10,
                                  n_double=10, seed=0)
    adata.varm["cape_gene_embedding"] = pca_gene_embeddings(adata, 4)
    assert cape.tl.predict_perturbation(adata, seed=0, predictor_kwargs={"epochs": 5}) is None
    out = adata.uns["cape_perturbation"]
    metrics = out["metrics"]
    assert adata.uns["cape"]["predict_perturbation"]["metrics"] == metrics
    assert list(out["predicted_mean"].index) == out["split"]["test"]
    assert list(out["predicted_mean"].columns) == list(adata.var_names)
    assert metrics["mse_overall"] == pytest.approx(np.mean(list(out["top_de_mse"].values())))
    assert set(out["baselines"]) == {"no_change", "train_mean", "additive", "linear"}
    adata.write_h5ad(tmp_path / "p.h5ad")  # everything set is storable
    back = ad.read_h5ad(tmp_path / "p.h5ad").uns["cape_perturbation"]
    pd.testing.assert_frame_equal(back["predicted_mean"], out["predicted_mean"], check_names=False)
    with pytest.raises(CapeInputError, match="gene embeddings"):
        cape.tl.predict_perturbation(adata, gene_embedding_key="missing")
