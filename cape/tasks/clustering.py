"""Cell-clustering benchmark (CAPE Sec. 5.3, Supp. E.3, Table S2): k-means with k = number of labels on a cell
embedding, scored by ARI, NMI and ASW, plus the paper's baselines that run here.

Baselines (Supp. F.3.2): PCA + k-means always; when a batch key exists also KNN imputation + ComBat (scanpy),
Harmony (harmonypy) and Scanorama; MAGIC when ``magic-impute`` is importable (it is not installed by default: it
pins an old pandas). Every baseline ends in a PCA-like embedding that is clustered the same way.

ASW is the silhouette width of the embedding under the ground-truth labels (Euclidean, in [-1, 1]), the usual
"cell-type ASW"; ARI and NMI compare the k-means clusters with the labels.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
from collections.abc import Callable, Sequence

import anndata as ad
import numpy as np
import pandas as pd
import scanpy as sc
import scipy.sparse as sp
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA
from sklearn.impute import KNNImputer
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score, silhouette_score

from .._errors import CapeInputError
from .labels import checked_labels

logger = logging.getLogger("cape")


def clustering_metrics(embedding: np.ndarray, labels: Sequence[str], clusters: Sequence[int]) -> dict[str, float]:
    """ARI and NMI of ``clusters`` against ``labels``; ASW of ``embedding`` under ``labels``."""

    y = np.asarray(labels).astype(str)
    return {"ARI": float(adjusted_rand_score(y, clusters)),
            "NMI": float(normalized_mutual_info_score(y, clusters)),
            "ASW": float(silhouette_score(embedding, y))}


def kmeans_clusters(embedding: np.ndarray, n_clusters: int, *, seed: int = 0) -> np.ndarray:
    """k-means (scikit-learn, 10 restarts) seeded by ``seed``."""

    return KMeans(n_clusters=n_clusters, n_init=10, random_state=seed).fit_predict(embedding)


def cluster_embedding(adata: ad.AnnData, label_key: str, *, obsm_key: str = "X_cape", seed: int = 0) -> dict:
    """k-means with k = number of classes on ``obsm[obsm_key]``; returns ARI, NMI, ASW and k.

    Classes with fewer than 2 cells are dropped with a warning (silhouette needs 2 cells per class).
    """
    labels = checked_labels(adata, label_key)
    if obsm_key not in adata.obsm:
        raise CapeInputError(f"embedding obsm[{obsm_key!r}] not found; obsm keys: "
                             f"{', '.join(adata.obsm.keys()) or '(none)'}")
    emb = np.asarray(adata[labels.index].obsm[obsm_key], dtype=np.float64)
    if emb.ndim != 2 or not np.isfinite(emb).all():
        raise CapeInputError(f"obsm[{obsm_key!r}] must be a finite 2-D array")
    k = labels.nunique()  # every class has ≥ 2 cells (checked_labels), so there are more cells than clusters
    clusters = kmeans_clusters(emb, k, seed=seed)
    return clustering_metrics(emb, labels.to_numpy(), clusters) | {"k": k}


# ----------------------------------------------------------------------------------------------------------------
# baselines: each maps (X, batches, seed) → an embedding
# ----------------------------------------------------------------------------------------------------------------
#: A sparse matrix with more entries than this (2²⁵: 256 MiB as dense float64) is never densified for PCA.
DENSE_PCA_MAX_ENTRIES = 2**25


def pca_embedding(x, n_comps: int = 50, *, seed: int = 0) -> np.ndarray:
    """PCA scores of ``x``. A scipy sparse ``x`` of more than :data:`DENSE_PCA_MAX_ENTRIES` entries is centred
    implicitly by ARPACK (exact PCA, never densified); smaller ones are densified and take scikit-learn's default
    solver, as dense input does."""

    k = min(n_comps, x.shape[0] - 1, x.shape[1])
    if sp.issparse(x) and k < min(x.shape) and x.shape[0] * x.shape[1] > DENSE_PCA_MAX_ENTRIES:
        return PCA(n_components=k, svd_solver="arpack", random_state=seed).fit_transform(
            sp.csr_matrix(x, dtype=np.float64))
    if sp.issparse(x):
        x = x.toarray()
    return PCA(n_components=k, random_state=seed).fit_transform(x)


def knn_impute(x: np.ndarray, n_neighbors: int = 5) -> np.ndarray:
    """Fill missing values (NaN) from the cell's nearest neighbours (scikit-learn ``KNNImputer``)."""

    if sp.issparse(x) and not np.isnan(x.data).any():
        return x
    if sp.issparse(x):
        x = x.toarray()
    if not np.isnan(x).any():
        return x
    return KNNImputer(n_neighbors=n_neighbors).fit_transform(x)


def _pca(x, batches, seed, n_comps):
    return pca_embedding(x, n_comps, seed=seed)


def _knn_combat(x, batches, seed, n_comps):
    tmp = ad.AnnData(knn_impute(x).astype(np.float64))
    tmp.obs["batch"] = np.asarray(batches).astype(str)
    sc.pp.combat(tmp, key="batch")
    return pca_embedding(np.asarray(tmp.X), n_comps, seed=seed)


def _harmony(x, batches, seed, n_comps):
    import harmonypy  # optional dependency (extra `baselines`)

    pcs = pca_embedding(x, n_comps, seed=seed)
    meta = pd.DataFrame({"batch": np.asarray(batches).astype(str)})
    out = harmonypy.run_harmony(pcs, meta, ["batch"], random_state=seed, verbose=False)
    z = np.asarray(out.Z_corr.detach().cpu().numpy() if hasattr(out.Z_corr, "detach") else out.Z_corr)
    return z if z.shape[0] == x.shape[0] else z.T  # harmonypy has returned both orientations across versions


def _scanorama(x, batches, seed, n_comps):
    import scanorama  # optional dependency (extra `baselines`)

    b = np.asarray(batches).astype(str)
    names = list(dict.fromkeys(b))
    genes = [f"g{i}" for i in range(x.shape[1])]
    parts = [x[b == n] for n in names]
    dimred = min(n_comps, min(p.shape[0] for p in parts) - 1, x.shape[1])
    with contextlib.redirect_stdout(io.StringIO()):  # scanorama prints progress
        integrated, _ = scanorama.integrate(parts, [genes] * len(parts), dimred=dimred, seed=seed, verbose=0)
    out = np.zeros((x.shape[0], integrated[0].shape[1]))
    for n, z in zip(names, integrated, strict=True):
        out[b == n] = z
    return out


def _magic(x, batches, seed, n_comps):
    import magic  # optional dependency (magic-impute, not installed by default)

    smoothed = magic.MAGIC(random_state=seed, verbose=0).fit_transform(x)
    return pca_embedding(np.asarray(smoothed), n_comps, seed=seed)


Baseline = Callable[[np.ndarray, "np.ndarray | None", int, int], np.ndarray]
#: Baselines that take a scipy sparse matrix as it is (a raw 10x matrix is never densified for them).
SPARSE_BASELINES = frozenset({"pca_kmeans", "harmony"})
#: name → (embedding function, needs a batch key, importable module or None)
BASELINES: dict[str, tuple[Baseline, bool, str | None]] = {
    "pca_kmeans": (_pca, False, None),
    "knn_combat": (_knn_combat, True, None),
    "harmony": (_harmony, True, "harmonypy"),
    "scanorama": (_scanorama, True, "scanorama"),
    "magic": (_magic, False, "magic"),
}


def available_baselines(has_batch: bool) -> list[str]:
    """Baselines that can run: batch methods only with a batch key, optional packages only when installed."""
    return [name for name, (_, needs_batch, module) in BASELINES.items()
            if (has_batch or not needs_batch) and (module is None or importlib.util.find_spec(module) is not None)]


def expression_matrix(adata: ad.AnnData, *, keep_sparse: bool = False, allow_nan: bool = False):
    """``X`` as float64: dense, or a CSR matrix with ``keep_sparse`` when X is sparse (and, with ``allow_nan``, free
    of NaN). Missing values (NaN, e.g. proteomics) are refused unless ``allow_nan`` (for :func:`knn_impute`);
    infinite values are refused then."""
    if keep_sparse and sp.issparse(adata.X) and not (allow_nan and np.isnan(adata.X.data).any()):
        x = sp.csr_matrix(adata.X, dtype=np.float64)
        values = x.data
    else:
        x = (adata.X.toarray() if sp.issparse(adata.X) else np.asarray(adata.X)).astype(np.float64)
        values = x
    if not allow_nan and np.isnan(values).any():
        raise CapeInputError("X has missing values (NaN); impute them first (e.g. cape.tasks.clustering.knn_impute)")
    if allow_nan and np.isinf(values).any():
        raise CapeInputError("X has infinite values")
    return x
