"""Downstream tasks on AnnData (scanpy style): cell-type annotation, clustering and perturbation prediction.

Thin wrappers: the models live in :mod:`cape.models`, splits, recipes and metrics in :mod:`cape.tasks`.

Fields set
----------
Each tool returns ``None`` (the AnnData copy with ``copy=True``); metrics go to ``uns``, never the return value.

``annotate``
    ``obs[key_added]`` predicted labels of every cell, ``obs["cape_split"]`` (``fine_tune`` / ``test`` /
    ``unused``), ``uns["cape"]["annotate"]`` (parameters, seed, metrics on the test cells, seconds).
``cluster``
    ``obs[key_added]`` k-means clusters, ``uns["cape"]["cluster"]`` (k, seed, ARI/NMI/ASW when labels are given).
``predict_perturbation``
    ``uns[key_added]``: predicted mean expression of each test perturbation (DataFrame), per-perturbation top-DE
    MSE, the GEARS split and the metrics of the embedding predictor and of the no-change, training-mean, additive
    and linear baselines;
    ``uns["cape"]["predict_perturbation"]`` (parameters, metrics).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from .._errors import CapeInputError
from .._settings import PROGRESS, resolve_seed
from ..models import CellTransformer
from ..models.hyperparameters import DEFAULT_RECIPE
from ..tasks.annotation import annotation_metrics, fine_tune_cells, record_split, split_roles
from ..tasks.clustering import clustering_metrics, kmeans_clusters
from ..tasks.labels import checked_labels
from ..tasks.perturbation import PerturbationTask
from ..tasks.perturbation_predictors import EmbeddingPerturbationPredictor, simple_baselines
from ._uns import step_key

logger = logging.getLogger("cape")


def _record(adata: ad.AnnData, step: str, entry: dict, key_added: str, default: str) -> None:
    """``entry`` into ``uns["cape"][step]``, or ``uns["cape"][key_added]`` for another than the default key."""
    adata.uns.setdefault("cape", {})[step_key(step, key_added, default)] = entry


def annotate(adata: ad.AnnData, label_key: str, *, encoding: str = "cape", model: CellTransformer | None = None,
             fine_tune_fraction: float = 0.3, pretrain_epochs: int = DEFAULT_RECIPE.pretrain_epochs,
             epochs: int = DEFAULT_RECIPE.epochs, seed: int | None = None, key_added: str = "cape_prediction",
             model_kwargs: dict[str, Any] | None = None, train_kwargs: dict[str, Any] | None = None,
             copy: bool = False):
    """Cell-type annotation (CAPE Supp. F.1.1): fine-tune a transformer on a stratified ``fine_tune_fraction`` of
    the labelled cells and score the rest.

    Parameters
    ----------
    adata
        Log-normalised cells × genes with labels in ``obs[label_key]`` and, for ``encoding="cape"``, the keys of
        Steps I–III (``cape.tl.cape``).
    label_key
        obs column with the cell types; classes with fewer than 2 cells are excluded with a warning.
    encoding, model_kwargs
        The positional encoding and further keywords of the :class:`cape.models.CellTransformer` built when
        ``model`` is None (e.g. ``architecture="scbert"``, ``device="cpu"``, ``d_model=32``; its defaults are the
        recipe of ``cape train``, :data:`~cape.models.hyperparameters.DEFAULT_RECIPE`: scGPT on ``device="auto"``).
    model
        A :class:`~cape.models.CellTransformer` already built and pretrained (e.g. by ``cape train`` and
        :meth:`~cape.models.CellTransformer.load`, or :meth:`~cape.models.CellTransformer.pretrain`) to fine-tune
        instead of building one: it is not pretrained again, which saves the ``pretrain_epochs``.
    fine_tune_fraction
        Share of the labelled cells used for fine-tuning (paper 0.3); the others are test cells.
    pretrain_epochs
        Self-supervised pretraining epochs on every cell (no labels: masked values and each cell's expression
        profile, :meth:`~cape.models.CellTransformer.pretrain`) before fine-tuning a model built here, announced in
        a progress line; 0 skips. Ignored when ``model`` is given.
    epochs, train_kwargs
        Most fine-tuning epochs (early stopping on a validation part of the fine-tune cells) and further
        :meth:`~cape.models.CellTransformer.train` keywords (``batch_size``, ``plan`` — a
        :class:`~cape.models.TrainingPlan` — or its fields by name, ``pooling``...).
    seed
        Seeds the split and the model (default ``cape.settings.seed``).
    key_added
        obs column of the predicted labels.
    copy
        Work on a copy and return it.

    Reads
    -----
    ``X``, ``obs[label_key]``, and the positions ``encoding`` needs (for ``"cape"``: ``varm["cape_angles"]`` or
    ``varm["cape_poincare"]``, ``varp["cape_dag"]``, ``var["cape_used"]``; see :func:`cape.models.gene_positions`).

    Writes
    ------
    ``obs["cape_prediction"]`` (``key_added``), ``obs["cape_split"]``, ``uns["cape"]["annotate"]``.

    Returns
    -------
    ``None`` (the copy when ``copy=True``). The metrics ``{"accuracy", "macro_f1", "n_fine_tune", "n_test"}`` on
    the test cells are in ``uns["cape"]["annotate"]["metrics"]``.
    """
    if not 0 < fine_tune_fraction < 1:
        raise CapeInputError(f"fine_tune_fraction must be in (0, 1), got {fine_tune_fraction}")
    adata = adata.copy() if copy else adata
    seed = resolve_seed(seed)
    start = time.perf_counter()
    labels = checked_labels(adata, label_key)
    roles, split = split_roles(adata, labels, seed=seed, fine_tune_fraction=fine_tune_fraction)
    if model is None:
        model = CellTransformer(adata, encoding=encoding, seed=seed, **dict(model_kwargs or {}))
        if pretrain_epochs > 0:
            logger.log(PROGRESS, "annotate: pretraining %d epochs on all %d cells before fine-tuning; pass "
                       "pretrain_epochs=0 to skip, or model= an already pretrained CellTransformer",
                       pretrain_epochs, adata.n_obs)
            model.pretrain(adata, epochs=pretrain_epochs)
    else:
        pretrain_epochs = 0  # recorded as run here: the model's own pretraining is in its history
    model.train(fine_tune_cells(adata, roles, labels, label_key), label_key, epochs=epochs, **(train_kwargs or {}))
    predicted = model.predict(adata, key_added=key_added)
    record_split(adata, roles)
    test = roles == "test"
    metrics = annotation_metrics(labels.reindex(adata.obs_names[test]).to_numpy(), np.asarray(predicted)[test])
    metrics |= {"n_fine_tune": len(split.fine_tune), "n_test": len(split.test)}
    _record(adata, "annotate", {"params": {"label_key": label_key, "architecture": model.architecture,
                                           "fine_tune_fraction": float(fine_tune_fraction),
                                           "pretrain_epochs": int(pretrain_epochs), "epochs": int(epochs),
                                           "key_added": key_added},
                                "seed": int(seed), "metrics": metrics, "seconds": time.perf_counter() - start},
            key_added, "cape_prediction")
    logger.info("annotation: accuracy %.3f, macro-F1 %.3f on %d test cells", metrics["accuracy"],
                metrics["macro_f1"], metrics["n_test"])
    return adata if copy else None


def cluster(adata: ad.AnnData, label_key: str | None = None, *, obsm_key: str = "X_cape",
            n_clusters: int | None = None, seed: int | None = None, key_added: str = "cape_cluster",
            copy: bool = False):
    """k-means on a cell embedding (CAPE Supp. E.3); with labels, ARI and NMI against them and the label ASW.

    Parameters
    ----------
    adata
        AnnData with the embedding in ``obsm[obsm_key]`` (e.g. from :meth:`cape.models.CellTransformer.embed`).
    label_key
        Optional obs column with true labels: sets k (unless ``n_clusters``) and gives the metrics.
    n_clusters
        k; required without ``label_key``.
    seed
        k-means seed (default ``cape.settings.seed``).
    key_added
        obs column of the clusters (categorical of strings ``"0"``, ``"1"``, ...).
    copy
        Work on a copy and return it.

    Reads
    -----
    ``obsm["X_cape"]`` (``obsm_key``) and ``obs[label_key]``.

    Writes
    ------
    ``obs["cape_cluster"]`` (``key_added``), ``uns["cape"]["cluster"]``.

    Returns
    -------
    ``None`` (the copy when ``copy=True``). The metrics ``{"ARI", "NMI", "ASW", "k"}`` (only ``k`` without labels)
    are in ``uns["cape"]["cluster"]["metrics"]``.
    """
    if obsm_key not in adata.obsm:
        raise CapeInputError(f"embedding obsm[{obsm_key!r}] not found; obsm keys: "
                             f"{', '.join(adata.obsm.keys()) or '(none)'}")
    emb = np.asarray(adata.obsm[obsm_key], dtype=np.float64)
    if emb.ndim != 2 or not np.isfinite(emb).all():
        raise CapeInputError(f"obsm[{obsm_key!r}] must be a finite 2-D array")
    labels = checked_labels(adata, label_key) if label_key is not None else None
    if n_clusters is None:
        if labels is None:
            raise CapeInputError("give n_clusters or a label_key (k = number of labels)")
        n_clusters = labels.nunique()
    if not 1 < n_clusters < adata.n_obs:
        raise CapeInputError(f"n_clusters must be between 2 and the number of cells - 1, got {n_clusters}")
    adata = adata.copy() if copy else adata
    seed = resolve_seed(seed)
    clusters = kmeans_clusters(emb, int(n_clusters), seed=seed)
    adata.obs[key_added] = pd.Categorical(clusters.astype(str))
    metrics: dict[str, float] = {"k": int(n_clusters)}
    if labels is not None:
        rows = adata.obs_names.get_indexer(labels.index)
        metrics |= clustering_metrics(emb[rows], labels.to_numpy(), clusters[rows])
    _record(adata, "cluster", {"params": {"obsm_key": obsm_key, "label_key": label_key or "none",
                                          "key_added": key_added}, "seed": int(seed), "metrics": metrics},
            key_added, "cape_cluster")
    return adata if copy else None


def predict_perturbation(adata: ad.AnnData, *, gene_embedding_key: str = "cape_gene_embedding",
                         condition_key: str = "condition", control: str = "ctrl", split_seed: int = 1,
                         seed: int | None = None, n_de: int = 20, predictor_kwargs: dict[str, Any] | None = None,
                         key_added: str = "cape_perturbation", copy: bool = False):
    """Predict unseen perturbations from gene embeddings (CAPE Sec. 5.2, GEARS setting).

    GEARS' simulation split (``split_seed``, default 1) of the conditions in ``obs[condition_key]``; an
    :class:`~cape.tasks.perturbation_predictors.EmbeddingPerturbationPredictor` reading
    ``varm[gene_embedding_key]`` (e.g. written by :meth:`cape.models.CellTransformer.embed` on control cells) is
    trained on the training perturbations and scored by the top-``n_de`` DE-gene MSE on the test perturbations,
    next to the baselines users try first: no change, the training perturbations' mean, additive, and the linear
    model of Ahlmann-Eltze, Huber & Anders (2025).

    Reads
    -----
    ``X``, ``obs["condition"]`` (``condition_key``) and ``varm["cape_gene_embedding"]`` (``gene_embedding_key``).

    Writes
    ------
    ``uns["cape_perturbation"]`` (``key_added``), ``uns["cape"]["predict_perturbation"]``.

    Returns
    -------
    ``None`` (the copy when ``copy=True``). The metrics of the embedding predictor (``mse_single``,
    ``mse_double``, ``mse_combo_seen0/1/2``, ``mse_overall``) are in ``uns[key_added]["metrics"]`` and
    ``uns["cape"]["predict_perturbation"]["metrics"]``; see the module docstring for the other fields.
    """
    if gene_embedding_key not in adata.varm:
        raise CapeInputError(f"gene embeddings varm[{gene_embedding_key!r}] not found: run "
                             "CellTransformer.embed(adata) (or `cape train`) first")
    task = PerturbationTask.build(adata, condition_key=condition_key, control=control, split_seed=split_seed,
                                  n_de=n_de)
    adata = adata.copy() if copy else adata
    seed = resolve_seed(seed)
    predictor = EmbeddingPerturbationPredictor(np.asarray(adata.varm[gene_embedding_key]), seed=seed,
                                               **(predictor_kwargs or {}))
    predicted, per_condition, metrics = task.evaluate(predictor)
    baselines = {p.name: task.score(p) for p in simple_baselines()}
    adata.uns[key_added] = {
        "predicted_mean": predicted,
        "top_de_mse": per_condition.to_dict(),
        "split": {"train": list(task.split.train), "val": list(task.split.val), "test": list(task.split.test),
                  "subgroup": dict(task.split.subgroup)},
        "metrics": metrics,
        "baselines": baselines,
    }
    _record(adata, "predict_perturbation", {
        "params": {"gene_embedding_key": gene_embedding_key, "condition_key": condition_key, "control": control,
                   "split_seed": int(split_seed), "n_de": int(n_de), "key_added": key_added},
        "seed": int(seed), "metrics": metrics}, key_added, "cape_perturbation")
    return adata if copy else None
