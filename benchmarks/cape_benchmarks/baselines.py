"""``cape-bench baselines``: the task baselines that need no transformer, run over seeds and written as records
``{task, dataset, method, seed, metric, value, ...}`` (the baselines themselves live in :mod:`cape.tasks`)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import anndata as ad
import numpy as np
import pandas as pd

from cape._errors import CapeInputError
from cape.tasks.annotation import checked_labels, logistic_regression_pca
from cape.tasks.clustering import (
    BASELINES,
    SPARSE_BASELINES,
    available_baselines,
    clustering_metrics,
    expression_matrix,
    kmeans_clusters,
    knn_impute,
)
from cape.tasks.perturbation import (
    CONTROL,
    condition_means,
    simulation_split,
    summarise,
    top_de_genes,
    top_de_mse,
    top_de_pearson_delta,
    validate_perturbation_data,
)
from cape.tasks.perturbation_predictors import EmbeddingPerturbationPredictor, simple_baselines
from cape.tasks.perturbation_scm import SCMPerturbationPredictor


def run_annotation_baselines(adata: ad.AnnData, label_key: str, *, dataset: str = "data",
                             seeds: Sequence[int] = (0, 1, 2), n_comps: int = 50) -> list[dict]:
    """The logistic-regression-on-PCA baseline for each seed (a seed fixes the split and the classifier)."""
    out = []
    for seed in seeds:
        res = logistic_regression_pca(adata, label_key, seed=seed, n_comps=n_comps)
        for metric in ("accuracy", "macro_f1"):
            out.append({"task": "annotation", "dataset": dataset, "method": f"logreg_pca{n_comps}", "seed": seed,
                        "metric": metric, "value": res[metric], "n_fine_tune": res["n_fine_tune"],
                        "n_test": res["n_test"]})
    return out


def run_clustering_baselines(adata: ad.AnnData, label_key: str, *, batch_key: str | None = None,
                             dataset: str = "data", seeds: Sequence[int] = (0,), n_comps: int = 50,
                             methods: Sequence[str] | None = None) -> list[dict]:
    """Each available baseline embedding, k-means with k = number of labels, ARI/NMI/ASW per seed.

    Returns records ``{task, dataset, method, seed, metric, value, seconds}``.
    """
    labels = checked_labels(adata, label_key)
    sub = adata[labels.index] if len(labels) < adata.n_obs else adata
    batches = None
    if batch_key is not None:
        if batch_key not in sub.obs:
            raise CapeInputError(f"batch key obs[{batch_key!r}] not found")
        batches = sub.obs[batch_key].astype(str).to_numpy()
        if len(set(batches)) < 2:
            raise CapeInputError(f"obs[{batch_key!r}] has a single batch; batch correction needs at least 2")
    names = available_baselines(batches is not None) if methods is None else list(methods)
    # Missing values (NaN, as in proteomics) are filled by KNN imputation once, for every method.
    x = knn_impute(expression_matrix(sub, keep_sparse=set(names) <= SPARSE_BASELINES, allow_nan=True))
    unknown = [m for m in names if m not in BASELINES]
    if unknown:
        raise CapeInputError(f"unknown clustering baseline(s) {', '.join(unknown)}; known: {', '.join(BASELINES)}")
    k = labels.nunique()
    y = labels.to_numpy()
    out = []
    for name in names:
        fn, needs_batch, _ = BASELINES[name]
        if needs_batch and batches is None:
            raise CapeInputError(f"baseline {name!r} needs a batch key")
        for seed in seeds:
            start = time.perf_counter()
            emb = fn(x, batches, seed, n_comps)
            res = clustering_metrics(emb, y, kmeans_clusters(emb, k, seed=seed))
            seconds = time.perf_counter() - start
            out += [{"task": "clustering", "dataset": dataset, "method": name, "seed": seed, "metric": m,
                     "value": v, "seconds": seconds} for m, v in res.items()]
    return out


def run_perturbation_benchmark(adata: ad.AnnData, *, dataset: str = "data",
                               gene_embeddings: Mapping[str, np.ndarray] | None = None,
                               condition_key: str = "condition", control: str = CONTROL, split_seed: int = 1,
                               seeds: Sequence[int] = (0,), n_de: int = 20, predictor_kwargs: dict | None = None,
                               scm: Mapping[str, dict] | None = None) -> list[dict]:
    """Split, DE genes, then no-change, additive, one embedding predictor per entry of ``gene_embeddings`` and one
    structural-equation predictor per entry of ``scm``.

    ``scm`` maps a row name to :class:`~cape.tasks.perturbation_scm.SCMPerturbationPredictor` arguments; rows
    that learn a graph (``graph`` None) run once per seed (the seed of Step I), rows on a given graph once
    (seed ``None``: least squares is deterministic). The method name is ``scm_<equations>[<name>]``.

    Returns records ``{task, dataset, method, seed, subgroup, metric, value, n_perturbations}`` with metrics
    ``top{n_de}_de_mse`` and ``top{n_de}_de_pearson_delta``; ``subgroup`` is ``overall`` or one of
    :data:`SUBGROUPS`. The simple baselines (no change, training mean, additive, linear) are deterministic and reported
    once (seed ``None``); each embedding predictor runs once per seed.
    """
    conditions = validate_perturbation_data(adata, condition_key=condition_key, control=control)
    split = simulation_split(conditions, seed=split_seed)
    de = top_de_genes(adata, split.test, condition_key=condition_key, control=control, n_genes=n_de)
    truth = condition_means(adata, split.test, condition_key=condition_key)
    control_mean = condition_means(adata, [control], condition_key=condition_key).iloc[0]
    train = split.train + split.val  # no model selection here, so validation perturbations are trained on
    sizes = {g: len(c) for g, c in split.test_by_subgroup().items()} | {"overall": len(split.test)}

    def records(method: str, seed: int | None, predicted: pd.DataFrame) -> list[dict]:
        out = []
        for metric, per in ((f"top{n_de}_de_mse", top_de_mse(predicted, truth, de)),
                            (f"top{n_de}_de_pearson_delta", top_de_pearson_delta(predicted, truth, control_mean, de))):
            out += [{"task": "perturbation", "dataset": dataset, "method": method, "seed": seed, "subgroup": g,
                     "metric": metric, "value": v, "n_perturbations": sizes[g]}
                    for g, v in summarise(per, split).items()]
        return out

    out = []
    for predictor in simple_baselines():
        predictor.fit(adata, train, condition_key=condition_key, control=control)
        out += records(predictor.name, None, predictor.predict(split.test))
    for name, emb in (gene_embeddings or {}).items():
        for seed in seeds:
            model = EmbeddingPerturbationPredictor(emb, seed=seed, **(predictor_kwargs or {}))
            model.fit(adata, train, condition_key=condition_key, control=control)
            out += records(f"{model.name}[{name}]", seed, model.predict(split.test))
    for name, kwargs in (scm or {}).items():
        learns = kwargs.get("graph") is None
        for seed in (seeds if learns else [None]):
            model = SCMPerturbationPredictor(**kwargs, **({"seed": seed} if learns else {}))
            model.fit(adata, train, condition_key=condition_key, control=control)
            out += records(f"scm_{model.equations}[{name}]", seed, model.predict(split.test))
    return out
