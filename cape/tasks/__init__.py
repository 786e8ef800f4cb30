"""Downstream tasks, each implemented once: cell-type annotation, clustering and perturbation prediction (splits,
recipes, metrics, baselines), plus the attention diagnostic of a trained model.

Used by :mod:`cape.tl` (AnnData tools), ``cape train``/``evaluate`` and the run report, and the benchmarks
(``benchmarks/``, the ``cape-bench`` command).
"""

from __future__ import annotations

from .annotation import annotation_metrics, annotation_split, logistic_regression_pca
from .clustering import clustering_metrics, kmeans_clusters
from .labels import SPLIT_KEY, checked_labels, resolve_label_key
from .perturbation import PerturbationTask, simulation_split, to_gears_conditions, top_de_mse
from .perturbation_cell_eval import cell_eval_scores
from .perturbation_gears import GearsPerturbationPredictor
from .perturbation_predictors import (
    AdditivePredictor,
    EmbeddingPerturbationPredictor,
    LinearPerturbationPredictor,
    NoChangePredictor,
    TrainingMeanPredictor,
    simple_baselines,
)
from .perturbation_scm import SCMPerturbationPredictor
from .perturbation_transformer import TransformerPerturbationPredictor

__all__ = [
    "SPLIT_KEY",
    "AdditivePredictor",
    "EmbeddingPerturbationPredictor",
    "GearsPerturbationPredictor",
    "LinearPerturbationPredictor",
    "NoChangePredictor",
    "PerturbationTask",
    "SCMPerturbationPredictor",
    "TrainingMeanPredictor",
    "TransformerPerturbationPredictor",
    "annotation_metrics",
    "annotation_split",
    "cell_eval_scores",
    "checked_labels",
    "clustering_metrics",
    "kmeans_clusters",
    "logistic_regression_pca",
    "resolve_label_key",
    "simple_baselines",
    "simulation_split",
    "to_gears_conditions",
    "top_de_mse",
]
