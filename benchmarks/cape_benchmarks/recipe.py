"""``cape-bench recipe``: the backbone's training recipe against the previous one and against the baselines a user
tries first (logistic regression on PCA for annotation, PCA + k-means for clustering), seed by seed on the same
split, with paired intervals.

Each seed draws one fine-tune/test split (3:7, stratified) and one model initialisation, shared by the recipes. A
recipe is scored on the test cells (annotation) and by k-means on its cell embedding (clustering); the clustering
embedding of a recipe with pretraining comes from the pretrained model, before it sees any label, and is scored
as ``unsupervised``; without pretraining, the only embedding is the fine-tuned one, which has seen the fine-tune
cells' labels and is scored as ``supervised``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import anndata as ad
import numpy as np
import pandas as pd

from cape.models import CellTransformer
from cape.models.hyperparameters import DEFAULT_RECIPE, TrainingRecipe
from cape.tasks.annotation import (
    AnnotationSplit,
    annotation_metrics,
    annotation_split,
    fine_tune_cells,
    logistic_regression_pca,
    roles,
)
from cape.tasks.clustering import BASELINES, clustering_metrics, expression_matrix, kmeans_clusters
from cape.tasks.labels import checked_labels

from .paired import minimum_detectable_difference, paired_interval, verdict

logger = logging.getLogger("cape")

#: The recipe before this benchmark's: no pretraining, lr 1e-3, no dropout, 256 tokens per cell.
PREVIOUS_RECIPE = TrainingRecipe(pretrain_epochs=0, cell_weight=0.0, fit_lr=1e-3, dropout=0.0, max_len=256,
                                 fit_ceiling_patience=None)
#: The default recipe before its schedule was shortened for large data (issue 55): 40 pretraining epochs, every
#: one run, and the full fine-tuning patience at the accuracy's ceiling.
LONG_SCHEDULE_RECIPE = TrainingRecipe(pretrain_epochs=40, pretrain_patience=None, fit_ceiling_patience=None)

RECIPES = {"current": DEFAULT_RECIPE, "previous": PREVIOUS_RECIPE, "long_schedule": LONG_SCHEDULE_RECIPE}


@dataclass(frozen=True)
class ModelShape:
    """The network every recipe trains (the workflow's defaults)."""

    architecture: str = "scgpt"
    encoding: str = "trainable_absolute"
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4


def recipe_run(adata: ad.AnnData, label_key: str, recipe: TrainingRecipe, split: AnnotationSplit, seed: int,
               shape: ModelShape = ModelShape()) -> tuple[dict[str, float], np.ndarray, np.ndarray, str]:
    """One model trained by ``recipe``: its test metrics, test predictions, clustering embedding and whether that
    embedding is ``"unsupervised"`` (read before fine-tuning) or ``"supervised"``."""
    labels = checked_labels(adata, label_key)
    model = CellTransformer(adata, shape.architecture, shape.encoding, d_model=shape.d_model,
                            n_layers=shape.n_layers, n_heads=shape.n_heads, max_len=recipe.max_len,
                            dropout=recipe.dropout, seed=seed, device="cpu")
    cells = adata[labels.index]
    embedding, kind = None, "supervised"
    if recipe.pretrain_epochs > 0:
        model.pretrain(adata, epochs=recipe.pretrain_epochs, lr=recipe.pretrain_lr, cell_weight=recipe.cell_weight,
                       batch_size=recipe.batch_size, early_stopping_patience=recipe.pretrain_patience)
        embedding, kind = model.get_latent_representation(cells, pooling="cls"), "unsupervised"
    fine = fine_tune_cells(adata, roles(adata, labels, split), labels, label_key)
    model.train(fine, label_key, epochs=recipe.epochs, lr=recipe.fit_lr, batch_size=recipe.batch_size,
                early_stopping_patience=recipe.fit_patience, early_stopping_min_delta=recipe.fit_min_delta,
                early_stopping_ceiling_patience=recipe.fit_ceiling_patience)
    predicted = np.asarray(model.predict(cells[split.test]), dtype=str)
    if embedding is None:
        embedding = model.get_latent_representation(cells)
    metrics = annotation_metrics(labels.to_numpy()[split.test], predicted)
    # How long each phase ran before early stopping: a pretraining stopped on a plateau leaves <cls> empty.
    metrics["epochs_pretrain"] = len(model.history.get("pretrain", []))
    metrics["epochs_fine_tune"] = len(model.history.get("train", []))
    return metrics, predicted, embedding, kind


def run_recipe_benchmark(adata: ad.AnnData, label_key: str, *, dataset: str, seeds: Sequence[int],
                         recipes: Sequence[str] = tuple(RECIPES), shape: ModelShape = ModelShape()) -> list[dict]:
    """Records ``{task, dataset, method, seed, metric, value}`` of every recipe and both baselines, per seed."""
    labels = checked_labels(adata, label_key)
    y = labels.to_numpy()
    k = labels.nunique()
    records: list[dict] = []

    def add(task: str, method: str, seed: int, metrics: dict) -> None:
        records.extend({"task": task, "dataset": dataset, "method": method, "seed": int(seed), "metric": m,
                        "value": float(v)} for m, v in metrics.items())

    expression = expression_matrix(adata[labels.index], keep_sparse=True)
    for seed in seeds:
        split = annotation_split(y, seed=seed)
        baseline = logistic_regression_pca(adata[labels.index], label_key, seed=seed, split=split)
        add("annotation", "logreg_pca", seed, {m: baseline[m] for m in ("accuracy", "macro_f1")})
        pca = BASELINES["pca_kmeans"][0](expression, None, seed, 50)
        add("clustering", "pca_kmeans", seed, clustering_metrics(pca, y, kmeans_clusters(pca, k, seed=seed)))
        for name in recipes:
            start = time.perf_counter()
            metrics, _, embedding, kind = recipe_run(adata, label_key, RECIPES[name], split, seed, shape)
            add("annotation", name, seed, metrics | {"seconds": time.perf_counter() - start})
            clusters = kmeans_clusters(embedding, k, seed=seed)
            add("clustering", name, seed, clustering_metrics(embedding, y, clusters)
                | {"unsupervised": float(kind == "unsupervised")})
            logger.info("%s seed %d %s: accuracy %.3f (LR-PCA %.3f)", dataset, seed, name, metrics["accuracy"],
                        baseline["accuracy"])
    return records


#: Metrics of the paired table where less is better (the verdict reads their difference the other way).
LOWER_IS_BETTER = frozenset({"seconds"})
#: Each comparison of the paired table: (task, metric, method, reference).
COMPARISONS = (("annotation", "accuracy", "current", "logreg_pca"), ("annotation", "accuracy", "current", "previous"),
               ("annotation", "accuracy", "previous", "logreg_pca"), ("clustering", "ARI", "current", "pca_kmeans"),
               ("clustering", "ARI", "current", "previous"), ("clustering", "ARI", "previous", "pca_kmeans"),
               ("annotation", "accuracy", "current", "long_schedule"),
               ("clustering", "ARI", "current", "long_schedule"), ("annotation", "seconds", "current", "long_schedule"))


def paired_rows(records: Sequence[dict]) -> pd.DataFrame:
    """Per dataset and comparison: mean of each side, mean per-seed difference, its 95 % t interval, the verdict
    and the minimum detectable difference. A clustering embedding that has seen labels is named ``(supervised)``."""
    frame = pd.DataFrame(records)
    rows = []
    for dataset, sub in frame.groupby("dataset", sort=False):
        flags = sub[sub.metric == "unsupervised"].groupby("method")["value"].min()
        supervised = set(flags.index[flags < 1])  # an embedding that has seen the fine-tune labels
        for task, metric, method, reference in COMPARISONS:
            pick = sub[(sub.task == task) & (sub.metric == metric)]
            wide = pick.pivot_table(index="seed", columns="method", values="value")
            if method not in wide or reference not in wide:
                continue
            diff = (wide[method] - wide[reference]).dropna()
            mean, low, high = paired_interval(diff)
            method_name, reference_name = (f"{n} (supervised)" if task == "clustering" and n in supervised else n
                                           for n in (method, reference))
            comparison = f"{method_name} − {reference_name}"
            rows.append({"dataset": dataset, "task": task, "metric": metric, "comparison": comparison,
                         "method": float(wide[method].mean()), "reference": float(wide[reference].mean()),
                         "difference": mean, "low": low, "high": high,
                         "verdict": verdict(low, high, lower_is_better=metric in LOWER_IS_BETTER),
                         "mdd": minimum_detectable_difference(float(diff.std(ddof=1)), len(diff)),
                         "seeds": len(diff)})
    return pd.DataFrame(rows)


def recipe_settings() -> dict[str, dict]:
    """The recipes as plain dicts, for the report and the JSON records."""
    return {name: asdict(r) for name, r in RECIPES.items()}
