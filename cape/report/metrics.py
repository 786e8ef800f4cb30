"""The records of a trained run: annotation and clustering against same-run baselines, the graph, the attention
diagnostic. Records are flat dicts ``{task, dataset, method, seed, metric, value}``."""

from __future__ import annotations

import logging
import os

import anndata as ad
import numpy as np

from .._errors import CapeInputError
from ..models import CellTransformer
from ..tasks.annotation import AnnotationSplit, annotation_metrics, logistic_regression_pca
from ..tasks.attention_diagnostic import layer_non_relativity
from ..tasks.clustering import BASELINES, clustering_metrics, expression_matrix, kmeans_clusters, knn_impute
from ..tasks.labels import SPLIT_KEY, checked_labels
from .statistics import accuracy, adjusted_rand, bootstrap_difference, comparison_records

logger = logging.getLogger("cape")

#: obsm key of the cell embedding after fine-tuning (``cape train``), which has seen the fine-tune labels.
FINE_TUNED_KEY = "X_cape_fine_tuned"


def evaluate_run(adata: ad.AnnData, label_key: str | None, *, dataset: str = "data", seed: int = 0,
                 embedding_key: str = "X_cape") -> list[dict]:
    """Metrics of a trained run as records ``{task, dataset, method, seed, metric, value}``.

    * annotation (when ``obs[f"cape_{label_key}_prediction"]`` and ``obs["cape_split"]`` exist): accuracy and
      macro-F1 on the test cells, beside logistic regression on PCA trained on the same fine-tune cells;
    * clustering (when ``label_key`` is given): k-means (k = number of labels) on ``obsm[embedding_key]`` —
      ARI, NMI, ASW — beside PCA + k-means on the expression. The method is ``"cape"`` when that embedding was
      read before fine-tuning (``uns["cape"]["model"]["embedding"]`` not ``"fine_tuned"``), else
      ``"cape_fine_tuned"``: it has seen the fine-tune cells' labels, which PCA + k-means has not. The fine-tuned
      embedding ``obsm["X_cape_fine_tuned"]``, when present beside an unsupervised one, is scored as
      ``"cape_fine_tuned"`` too, without a comparison;
    * graph: edges of ``varp["cape_dag"]``, edges removed to make it acyclic, genes embedded;
    * comparison: the transformer minus its baseline (accuracy; ARI) with a seeded bootstrap interval over the
      cells (:func:`cape.report.statistics.bootstrap_difference`), which the report's verdict reads.
    """
    records: list[dict] = []

    def add(task: str, method: str, metrics: dict) -> None:
        records.extend({"task": task, "dataset": dataset, "method": method, "seed": seed, "metric": k,
                        "value": float(v)} for k, v in metrics.items() if isinstance(v, int | float))

    info = adata.uns.get("cape", {})
    if "cape_dag" in adata.varp:
        graph = {"edges": int((adata.varp["cape_dag"] != 0).sum())}
        removed = info.get("causal_graph", {}).get("removed_cycle_edges")
        if removed is not None:
            graph["edges_removed_for_acyclicity"] = int(removed)
        turned = info.get("causal_graph", {}).get("turned_cycle_edges")
        if turned is not None:  # records of runs from before cape turned edges have no count
            graph["edges_turned_for_acyclicity"] = int(turned)
        if "cape_embedded" in adata.var:
            graph["genes_embedded"] = int(adata.var["cape_embedded"].sum())
        if "cape_connected" in adata.var:
            graph["genes_with_an_edge"] = int(adata.var["cape_connected"].sum())
        at_origin = info.get("hyperbolic_embedding", {}).get("fraction_at_origin")
        if at_origin is not None:
            graph["fraction_of_genes_at_origin"] = float(at_origin)
        add("graph", "cape", graph)
    if label_key is None:
        return records
    labels = checked_labels(adata, label_key)
    pred_key = f"cape_{label_key}_prediction"
    if pred_key in adata.obs and SPLIT_KEY in adata.obs:
        split = adata.obs.loc[labels.index, SPLIT_KEY].astype(str).to_numpy()
        test = np.flatnonzero(split == "test")
        fine_tune = np.flatnonzero(split == "fine_tune")
        if test.size == 0 or fine_tune.size == 0:
            raise CapeInputError(f"obs[{SPLIT_KEY!r}] needs both 'fine_tune' and 'test' cells")
        predicted = adata.obs.loc[labels.index, pred_key].astype(str).to_numpy()
        truth = labels.to_numpy()[test]
        add("annotation", "cape", annotation_metrics(truth, predicted[test]))
        baseline = logistic_regression_pca(
            adata, label_key, seed=seed,
            split=AnnotationSplit(fine_tune, test, seed, fine_tune.size / (fine_tune.size + test.size)))
        add("annotation", "logreg_pca", {k: baseline[k] for k in ("accuracy", "macro_f1")})
        diff = bootstrap_difference(truth, predicted[test], baseline["test_predictions"], accuracy, seed=seed)
        records += comparison_records("annotation", "accuracy", "cape", "logreg_pca", diff, n_cells=test.size,
                                      dataset=dataset, seed=seed, n_fine_tune=fine_tune.size)
    elif pred_key in adata.obs:
        logger.warning("no obs[%r]: annotation metrics skipped (the model was fine-tuned on every cell)", SPLIT_KEY)
    # k-means with k = number of classes on the transformer's embedding and on PCA of the expression (the
    # "pca_kmeans" baseline of cape.tasks.clustering), kept here to compare the two clusterings cell by cell.
    y = labels.to_numpy()
    k = labels.nunique()
    sub = adata[labels.index] if len(labels) < adata.n_obs else adata
    clusters = {}
    # keep_sparse: a 10x-shaped X stays sparse (pca_embedding densifies only small matrices)
    expression = knn_impute(expression_matrix(sub, keep_sparse=True, allow_nan=True))
    supervised = info.get("model", {}).get("embedding") == "fine_tuned"
    method = "cape_fine_tuned" if supervised else "cape"
    embeddings = [(method, _cell_embedding(sub, embedding_key)),
                  ("pca_kmeans", BASELINES["pca_kmeans"][0](expression, None, seed, 50))]
    if not supervised and embedding_key == "X_cape":
        embeddings.append(("cape_fine_tuned", _cell_embedding(sub, FINE_TUNED_KEY)))
    for name, emb in embeddings:
        if emb is None:
            continue
        clusters[name] = kmeans_clusters(emb, k, seed=seed)
        add("clustering", name, clustering_metrics(emb, y, clusters[name]) | ({"k": k} if name == method else {}))
    if method in clusters and "pca_kmeans" in clusters:
        diff = bootstrap_difference(y, clusters[method], clusters["pca_kmeans"], adjusted_rand, seed=seed)
        records += comparison_records("clustering", "ARI", method, "pca_kmeans", diff, n_cells=len(y),
                                      dataset=dataset, seed=seed)
    return records


def _cell_embedding(adata: ad.AnnData, key: str) -> np.ndarray | None:
    if key not in adata.obsm:
        return None
    emb = np.asarray(adata.obsm[key], dtype=np.float64)
    if emb.ndim != 2 or not np.isfinite(emb).all():
        raise CapeInputError(f"obsm[{key!r}] must be a finite 2-D array")
    return emb


def attention_records(adata: ad.AnnData, model_dir: str | os.PathLike, *, dataset: str = "data", seed: int = 0,
                      n_cells: int = 256) -> list[dict]:
    """Behind-RoPE non-relativity of every attention layer of the trained model in ``model_dir``.

    Measured against the model's own gene positions and, when the AnnData has them, against the Poincaré
    positions of Step II (see :func:`cape.tasks.attention_diagnostic.layer_non_relativity`). A key that does not apply
    (e.g. an encoding without positions) is skipped with a log line.
    """
    model = CellTransformer.load(model_dir, adata, device="cpu")
    encoding = model.backbone.encoding_name
    records = []
    for key in ("model", "cape_poincare"):
        try:
            rows = layer_non_relativity(model, adata, key=key, n_cells=n_cells, seed=seed)
        except CapeInputError as err:
            logger.info("non-relativity against %s skipped: %s", key, err)
            continue
        label = "own positions" if key == "model" else "Poincaré distance"
        records.extend({"task": "attention", "dataset": dataset, "method": f"{encoding} vs {label}", "seed": seed,
                        "metric": f"non-relativity layer {r['layer']}", "value": float(r["nri"])} for r in rows)
    return records
