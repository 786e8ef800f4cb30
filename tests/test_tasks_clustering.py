from __future__ import annotations

import importlib.util

import anndata as ad
import numpy as np
import pandas as pd
import pytest

from cape import CapeInputError
from cape.tasks.clustering import (
    available_baselines,
    cluster_embedding,
    clustering_metrics,
    knn_impute,
)
from cape_benchmarks.baselines import run_clustering_baselines


def _blobs(sizes=(30, 25, 20), n_genes=10, seed=0, batch_shift=0.0) -> ad.AnnData:
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 4.0, size=(len(sizes), n_genes))
    x = np.vstack([c + rng.normal(size=(n, n_genes)) for c, n in zip(centres, sizes, strict=True)])
    labels = np.repeat([f"t{i}" for i in range(len(sizes))], sizes)
    batch = np.where(rng.random(len(labels)) < 0.5, "b1", "b2")
    x[batch == "b2"] += batch_shift  # a technical offset shared by all genes
    adata = ad.AnnData(x.astype(np.float32), obs=pd.DataFrame({"cell_type": labels, "batch": batch},
                                                              index=[f"c{i}" for i in range(len(labels))]))
    adata.obsm["X_cape"] = x[:, :4].copy()
    return adata


def test_metrics_match_sklearn_definitions():
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score, silhouette_score

    rng = np.random.default_rng(0)
    emb = rng.normal(size=(30, 3))
    labels = np.repeat(["a", "b", "c"], 10)
    clusters = rng.integers(0, 3, 30)
    m = clustering_metrics(emb, labels, clusters)
    assert m["ARI"] == pytest.approx(adjusted_rand_score(labels, clusters))
    assert m["NMI"] == pytest.approx(normalized_mutual_info_score(labels, clusters))
    assert m["ASW"] == pytest.approx(silhouette_score(emb, labels))
    # Relabelling the clusters changes nothing.
    perm = np.array([2, 0, 1])[clusters]
    assert clustering_metrics(emb, labels, perm)["ARI"] == pytest.approx(m["ARI"])


def test_kmeans_on_obsm_recovers_separated_blobs():
    res = cluster_embedding(_blobs(), "cell_type", obsm_key="X_cape", seed=0)
    assert res["k"] == 3
    assert res["ARI"] > 0.95 and res["NMI"] > 0.9 and res["ASW"] > 0.3
    assert cluster_embedding(_blobs(), "cell_type", seed=0) == res  # seeded


def test_missing_embedding_key():
    with pytest.raises(CapeInputError, match=r"obsm\['X_other'\] not found"):
        cluster_embedding(_blobs(), "cell_type", obsm_key="X_other")


def test_missing_label_key_and_single_class():
    with pytest.raises(CapeInputError, match=r"label key obs\['labels'\] not found"):
        run_clustering_baselines(_blobs(), "labels")
    adata = _blobs()
    adata.obs["cell_type"] = "one"
    with pytest.raises(CapeInputError, match="1 class"):
        cluster_embedding(adata, "cell_type")


def test_class_with_one_cell_excluded_with_warning():
    adata = _blobs()
    labels = adata.obs["cell_type"].to_numpy().copy()
    labels[0] = "singleton"
    adata.obs["cell_type"] = labels
    with pytest.warns(UserWarning, match="singleton"):
        res = cluster_embedding(adata, "cell_type")
    assert res["k"] == 3


def test_baselines_without_batch_key():
    assert "pca_kmeans" in available_baselines(False)
    assert not {"knn_combat", "harmony", "scanorama"} & set(available_baselines(False))
    recs = run_clustering_baselines(_blobs(), "cell_type", dataset="blobs", seeds=(0,), n_comps=5)
    frame = pd.DataFrame(recs)
    assert set(frame["metric"]) == {"ARI", "NMI", "ASW"}
    assert frame.loc[frame["metric"] == "ARI", "value"].iloc[0] > 0.95


def test_batch_baselines_run_and_correct_a_batch_offset():
    adata = _blobs(batch_shift=6.0, seed=1)
    methods = ["pca_kmeans", "knn_combat"] + [m for m in ("harmony", "scanorama")
                                              if importlib.util.find_spec("harmonypy" if m == "harmony" else m)]
    recs = run_clustering_baselines(adata, "cell_type", batch_key="batch", seeds=(0,), n_comps=5, methods=methods)
    ari = {r["method"]: r["value"] for r in recs if r["metric"] == "ARI"}
    assert set(ari) == set(methods)
    # ComBat removes the per-batch offset, so the cell types separate again.
    assert ari["knn_combat"] > 0.9
    assert ari["knn_combat"] >= ari["pca_kmeans"]


def test_batch_key_problems():
    with pytest.raises(CapeInputError, match=r"batch key obs\['donor'\] not found"):
        run_clustering_baselines(_blobs(), "cell_type", batch_key="donor")
    adata = _blobs()
    adata.obs["batch"] = "only"
    with pytest.raises(CapeInputError, match="single batch"):
        run_clustering_baselines(adata, "cell_type", batch_key="batch")
    with pytest.raises(CapeInputError, match="needs a batch key"):
        run_clustering_baselines(_blobs(), "cell_type", methods=["harmony"])


def test_knn_impute_fills_only_missing_values():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 5))
    holes = x.copy()
    holes[3, 1] = holes[7, 4] = np.nan
    filled = knn_impute(holes, n_neighbors=3)
    assert np.isfinite(filled).all()
    mask = ~np.isnan(holes)
    np.testing.assert_array_equal(filled[mask], x[mask])
    assert knn_impute(x) is x



def test_dataset_too_small_for_clustering():
    """Classes of one cell are dropped; when fewer than 2 classes remain, the error says so."""
    adata = ad.AnnData(np.arange(8, dtype=np.float32).reshape(4, 2),
                       obs=pd.DataFrame({"cell_type": ["a", "b", "c", "c"]}, index=list("wxyz")))
    adata.obsm["X_cape"] = np.asarray(adata.X)
    with pytest.warns(UserWarning, match="excluded: a, b"), pytest.raises(CapeInputError, match="1 class"):
        cluster_embedding(adata, "cell_type")


def test_pca_of_a_sparse_matrix_matches_dense_pca_without_densifying(monkeypatch):
    import scipy.sparse as sp
    from sklearn.decomposition import PCA

    import cape.tasks.clustering as clustering
    from cape.tasks.clustering import pca_embedding

    monkeypatch.setattr(clustering, "DENSE_PCA_MAX_ENTRIES", 100)  # 120 × 80: the sparse (ARPACK) path
    rng = np.random.default_rng(0)
    dense = rng.poisson(0.3, size=(120, 80)).astype(np.float64)
    got = pca_embedding(sp.csr_matrix(dense), 5, seed=0)
    want = PCA(n_components=5, svd_solver="full").fit_transform(dense)
    signs = np.sign((got * want).sum(0))  # components are defined up to sign
    np.testing.assert_allclose(got * signs, want, atol=1e-6)
