"""``cape-bench encodings``: every positional encoding × both backbones × seeds on one task, plus CAPE's ablations
(paper Tables 2, 3, S1, S2 on data that runs offline).

* **Variants.** Every registry encoding (:func:`cape.encodings.available`) and the paper's ablations (Sec. 5.3):
  ``cape_null`` (no positional encoding, = ``none``), ``cape_wo_csl`` (Step I replaced by an undirected
  |correlation| k-nearest-neighbour gene graph, the paper's "undirected similar matrix"), ``cape_wo_hyperbolic``
  (Step II in Euclidean space with plain SGD) and ``cape_wo_rotary`` (``cape_additive``: Poincaré coordinates
  added to the token embedding instead of rotating q/k).
* **Positions.** Steps I–III run once per dataset (seeded, on the cells the backbone is pretrained on) and are
  shared by every seed, backbone and encoding; their wall times and the graph size are recorded. Encodings that
  read a DAG order or graph (``rope``, ``hope``, ``tape``, ``grape_*``, ``trainable_relative``) use Step I's DAG.
* **Tasks.** ``annotation``: `cape train`'s recipe (no pretraining by default; ``annotation_pretrain_epochs``),
  fine-tune on a stratified 30 % split and score the other 70 % (accuracy, macro-F1); the fine-tuning's early
  stopping uses 20 % of the 30 %, never the test cells. ``clustering``: pretrain, embed (``<cls>`` state, no
  label fine-tuning), k-means with k = number of labels (ARI, NMI, ASW). ``perturbation``: Steps I–III and
  pretraining on control cells only; the backbone's contextual gene embeddings feed
  :class:`~cape.tasks.perturbation_predictors.EmbeddingPerturbationPredictor`; GEARS simulation split (seed 1);
  top-20 DE MSE for unseen singles and doubles (0/1/2 genes seen).
* **Baselines in the same run**: logistic regression on PCA (annotation, same split per seed), PCA + k-means
  (clustering), the simple perturbation baselines (no change, training mean, additive, linear).
* **Integration** (``integrations``): every model runs in ``complement`` mode (the backbone keeps its gene-identity
  embedding beside the encoding) and/or ``replace`` mode (the encoding takes its place, CAPE Supp. F.2; there
  ``cape_null`` has no gene identity at all, the paper's null); see :mod:`cape.models.modules.backbone`.
* **Maps and controls** (issue 33): ``--bands`` runs Step III with several bands per coordinate (``cape`` rows;
  ``cape_paper`` / ``cape_paper_oracle`` keep the paper's single band on the same e). Beside ``cape_oracle``
  (true DAG), ``cape`` (Step I's DAG) and ``cape_null``, three controls separate causal structure from gene
  identity (:mod:`cape_benchmarks.encodings_controls`, drawn with each model's seed): ``cape_oracle_random_directions``
  (the true DAG's norms, random directions), ``cape_oracle_permuted`` (the true DAG, gene labels permuted) and
  ``rope_random_order`` (RoPE on a random gene order).
* scBERT's Performer attention cannot add logit biases: encodings that add to the logits (Transformer-XL
  relative, HoPE, GRAPE-A) run on scBERT with exact softmax attention, recorded as ``attention = "softmax"`` and
  marked in the table. A model that cannot be built is recorded with ``kind = "skipped"`` and its reason.

Records (``<task>_<dataset>.json``): ``task, dataset, backbone, integration, encoding, seed, metric, value``,
``attention`` plus ``kind``
(``model``, ``baseline``, ``positions``, ``skipped``), the registry encoding and position set behind each row, and
seconds. The markdown table gives mean ± sd over seeds and, in parentheses, the difference to the backbone's
default encoding (scGPT: ``trainable_absolute``, scBERT: ``static_absolute``).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import platform
import resource
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

from cape._errors import CapeInputError
from cape._io import write_json, write_text
from cape._progress import progress
from cape._settings import settings as cape_settings
from cape.models.modules.backbone import INTEGRATIONS
from cape.tasks.annotation import annotation_split, logistic_regression_pca, validation_part
from cape.tasks.clustering import clustering_metrics, kmeans_clusters, pca_embedding
from cape.tasks.labels import checked_labels
from cape.tasks.perturbation import PerturbationTask
from cape.tasks.perturbation_predictors import (
    EmbeddingPerturbationPredictor,
    constant_gene_embeddings,
    pca_gene_embeddings,
    permuted_gene_embeddings,
    simple_baselines,
)

from .encodings_controls import apply_control
from .encodings_models import (
    BACKBONES,
    METRICS,
    NO_TRUE_DAG,
    TASKS,
    BenchmarkResult,
    BenchSettings,
    Variant,
    annotation_run,
    build_model,
    clustering_run,
    for_backbone,
    perturbation_run,
    position_sets,
    prepare_expression,
    variants,
)
from .encodings_report import markdown_report, paired_frame, plot_results

logger = logging.getLogger("cape")

# ----------------------------------------------------------------------------------------------------------------
# runner
# ----------------------------------------------------------------------------------------------------------------


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the ``--jobs`` workers, reaped when the pool
    closes): the run's cost on an idle machine, whatever the load."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def run_encodings_benchmark(adata: ad.AnnData, task: str, *, dataset: str = "data", label_key: str | None = None,
                            encoding_names: Sequence[str] | None = None,
                            backbones: Sequence[str] = BACKBONES, seeds: Sequence[int] = (0, 1, 2),
                            quick: bool = False, settings: BenchSettings | None = None,
                            out: str | Path | None = "results/bench", name: str | None = None,
                            positions_seed: int = 0, threads: int | None = 1, device: str | None = None,
                            jobs: int = 1, integrations: Sequence[str] = INTEGRATIONS) -> BenchmarkResult:
    """Run every variant × backbone × integration × seed on ``task`` and write ``<out>/<name>.{json,md,png}``.

    ``name`` defaults to ``<task>_<dataset>``; ``out=None`` writes nothing. ``threads`` sets torch's intra-op
    threads for the run (``None`` leaves it). ``positions_seed`` seeds Steps I–III, shared by every seed.
    ``jobs`` > 1 trains that many models at once in worker processes (each with ``threads`` threads; Steps I–III
    and the baselines still run once, here); every model is seeded, so the records do not depend on ``jobs``.
    """

    if task not in TASKS:
        raise CapeInputError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    bad = [b for b in backbones if b not in BACKBONES]
    if bad or not backbones:
        raise CapeInputError(f"unknown backbone(s) {', '.join(bad) or '(none)'}; choose from {', '.join(BACKBONES)}")
    if not seeds:
        raise CapeInputError("at least one seed is needed")
    if jobs < 1:
        raise CapeInputError(f"jobs must be at least 1, got {jobs}")
    bad = [i for i in integrations if i not in INTEGRATIONS]
    if bad or not integrations:
        raise CapeInputError(f"unknown integration(s) {', '.join(bad) or '(none)'}; choose from "
                             f"{', '.join(INTEGRATIONS)}")
    integrations = list(dict.fromkeys(integrations))
    rows = variants(encoding_names)
    settings = settings or BenchSettings.for_mode(quick)
    start_all, cpu_start = time.perf_counter(), _cpu_seconds()
    labels = None
    if task in ("annotation", "clustering"):
        if label_key is None:
            raise CapeInputError(f"task {task} needs a label key (obs column with cell types); pass --label-key")
        labels = checked_labels(adata, label_key)
        adata = adata[labels.index]
    data = prepare_expression(adata, settings.n_genes)
    ptask = None
    if task == "perturbation":
        ptask = PerturbationTask.build(data)
        position_data = ptask.control_cells
    else:
        position_data = data
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    records: list[dict] = []
    base = {"task": task, "dataset": dataset}
    try:
        sets, timings = position_sets(position_data, {v.positions for v in rows}, settings, seed=positions_seed,
                                      device=device)
        sets["none"] = position_data
        records += [{**base, "kind": "positions", "backbone": None, "encoding": f"positions:{t['position_set']}",
                     "seed": positions_seed, **t} for t in timings]
        splits = {s: annotation_split(labels, seed=s) for s in seeds} if task == "annotation" else {}
        if settings.annotation_score_on == "validation":
            splits = {s: validation_part(split, labels) for s, split in splits.items()}
        records += _baselines(task, data, labels, ptask, seeds, dataset, splits, settings.predictor_epochs)
        # Plan every (backbone, integration, variant, seed); a model identical to an earlier one (cape_null = none;
        # cape_paper = cape with one band) runs once.
        plan: list[tuple[str, str, Variant, int, tuple]] = []
        unique: dict[tuple, tuple[str, str, Variant, int]] = {}
        for backbone in backbones:
            for integration in integrations:
                for variant in (for_backbone(v, backbone) for v in rows):
                    for seed in seeds:
                        # With one band Step III already wrote the paper's map: cape_paper is the cape model.
                        same = "cape" if variant.encoding == "cape_paper" and settings.bands == 1 else None
                        key = (backbone, integration, same or variant.encoding, variant.positions, variant.control,
                               seed)
                        unique.setdefault(key, (backbone, integration, variant, seed))
                        plan.append((backbone, integration, variant, seed, key))
        context = _RunContext(task, sets, labels, splits, ptask, settings, device, threads)
        outcomes = _run_models(context, unique, jobs)
        first_of: dict[tuple, str] = {}
        failed: set[tuple[str, str, str]] = set()
        for backbone, integration, variant, seed, key in plan:
            if (backbone, integration, variant.name) in failed:
                continue
            values, seconds, error, attention = outcomes[key]
            where = {"backbone": backbone, "integration": integration, "encoding": variant.name}
            if error is not None:  # e.g. positions wider than the heads' rotary planes: the same for every seed
                logger.warning("%s on %s (%s) not run: %s", variant.name, backbone, integration, error)
                records.append({**base, "kind": "skipped", **where, "seed": None, "metric": "skipped",
                                "value": None, "reason": error})
                failed.add((backbone, integration, variant.name))
                continue
            extra = {"same_run_as": first_of[key]} if key in first_of else {}
            if not extra:
                first_of[key] = variant.name
                logger.info("%s %s/%s/%s seed %d: %s (%.1f s)", task, backbone, integration, variant.name, seed,
                            ", ".join(f"{k} {v:.4f}" for k, v in values.items()), seconds)
            records += [{**base, "kind": "model", **where, "seed": seed, "metric": m, "value": v,
                         "registry_encoding": variant.encoding, "position_set": variant.positions,
                         **({"control": variant.control, "control_seed": seed} if variant.control else {}),
                         "attention": attention, "seconds": seconds, **extra}
                        for m, v in values.items()]
    finally:
        torch.set_num_threads(previous)
    seconds = time.perf_counter() - start_all
    result = BenchmarkResult(records, settings, seconds, {}, _cpu_seconds() - cpu_start)
    if out is not None:
        out = Path(out)
        stem = out / (name or f"{task}_{dataset}")
        out.mkdir(parents=True, exist_ok=True)
        info = {"n_cells": data.n_obs, "n_genes": data.n_vars, "seeds": list(seeds), "quick": quick,
                "integrations": integrations,
                "threads": threads, "cpu_count": len(os.sched_getaffinity(0)), "machine": platform.machine(),
                "load_average": os.getloadavg()[0]}
        result.paths = {"json": write_json(records, stem.with_suffix(".json")),
                        "md": write_text(markdown_report(result, task, dataset, info), stem.with_suffix(".md")),
                        "png": stem.with_suffix(".png")}
        plot_results(records, task, dataset, result.paths["png"])
        if len(seeds) > 1:
            paired = paired_frame(records, task)
            result.paths["paired"] = write_json(paired.to_dict(orient="records"),
                                                stem.with_name(stem.name + "_paired.json"))
    return result


@dataclass
class _RunContext:
    """What every model run of one benchmark shares (sent once to each worker process)."""

    task: str
    sets: dict
    labels: pd.Series | None
    splits: dict
    ptask: PerturbationTask | None
    settings: BenchSettings
    device: str | None
    threads: int | None


def _model_outcome(context: _RunContext, backbone: str, integration: str, variant: Variant, seed: int
                   ) -> tuple[dict[str, float] | None, float, str | None, str | None]:
    """Train and score one model: (metric values, seconds, None, attention kind), or (None, 0, reason, None) if it
    cannot be built."""
    t0 = time.perf_counter()
    if variant.positions not in context.sets:
        return None, 0.0, NO_TRUE_DAG, None
    pos_data = apply_control(context.sets[variant.positions], variant.control, seed)
    try:
        model = build_model(pos_data, backbone, variant, context.settings, seed, context.device, integration)
    except CapeInputError as err:
        return None, 0.0, str(err), None
    if context.task == "perturbation":
        values = perturbation_run(model, context.ptask, pos_data, context.settings, seed)
    elif context.task == "annotation":
        values = annotation_run(model, pos_data, context.labels, context.splits[seed], context.settings)
    else:
        values = clustering_run(model, pos_data, context.labels, context.settings, seed)
    return values, time.perf_counter() - t0, None, model.backbone.attention_kind


_WORKER_CONTEXT: _RunContext | None = None


def _worker_init(context: _RunContext) -> None:
    global _WORKER_CONTEXT
    _WORKER_CONTEXT = context
    if context.threads:
        torch.set_num_threads(context.threads)
    # The parent logs each result and shows one bar over the models; per-epoch bars of parallel runs would interleave.
    logging.getLogger("cape").setLevel(logging.WARNING)
    cape_settings.progress = False


def _worker_run(job: tuple[str, str, Variant, int]):
    assert _WORKER_CONTEXT is not None
    return _model_outcome(_WORKER_CONTEXT, *job)


def _run_models(context: _RunContext, unique: dict[tuple, tuple[str, str, Variant, int]], jobs: int) -> dict:
    """Outcome of every distinct model, in this process (``jobs`` = 1) or in a pool of worker processes."""
    if jobs == 1 or len(unique) <= 1:
        return {key: _model_outcome(context, *job) for key, job in unique.items()}

    # "spawn": a forked child would inherit torch's thread pools and locks from this process.
    with ProcessPoolExecutor(max_workers=min(jobs, len(unique)), mp_context=mp.get_context("spawn"),
                             initializer=_worker_init, initargs=(context,)) as pool:
        futures = {key: pool.submit(_worker_run, job) for key, job in unique.items()}
        for _ in progress(as_completed(futures.values()), desc="models", total=len(futures)):
            pass
        return {key: future.result() for key, future in futures.items()}


def _baselines(task: str, data: ad.AnnData, labels, ptask, seeds, dataset: str, splits: dict,
               predictor_epochs: int) -> list[dict]:
    base = {"task": task, "dataset": dataset, "kind": "baseline", "backbone": "baseline"}
    out = []
    if task == "annotation":
        cells = data[labels.index].copy()
        cells.obs["_label"] = labels.to_numpy()
        for seed in seeds:
            res = logistic_regression_pca(cells, "_label", seed=seed, split=splits[seed])
            out += [{**base, "encoding": "logreg_pca50", "seed": seed, "metric": m, "value": res[m]}
                    for m in METRICS["annotation"]]
    elif task == "clustering":
        emb = pca_embedding(np.asarray(data.X.toarray() if sp.issparse(data.X) else data.X, dtype=np.float64),
                            50)
        for seed in seeds:
            res = clustering_metrics(emb, labels.to_numpy(), kmeans_clusters(emb, labels.nunique(), seed=seed))
            out += [{**base, "encoding": "pca_kmeans", "seed": seed, "metric": m, "value": v} for m, v in res.items()]
    else:
        for predictor in simple_baselines():
            res = ptask.score(predictor)  # deterministic: once
            out += [{**base, "encoding": predictor.name, "seed": None, "metric": m, "value": v} for m, v in res.items()]
        # The embedding predictor on informative PCA gene embeddings and on two controls that carry no gene
        # knowledge: an encoding's embeddings should beat the controls, and the controls should not beat no-change.
        pca = pca_gene_embeddings(ptask.adata, min(16, ptask.adata.n_vars - 1), condition_key=ptask.condition_key,
                                  control=ptask.control)
        controls = {"embedding_pca": lambda s: pca, "control_constant": lambda s: constant_gene_embeddings(*pca.shape),
                    "control_permuted": lambda s: permuted_gene_embeddings(pca, seed=s)}
        for name, make in controls.items():
            for seed in seeds:
                res = ptask.score(EmbeddingPerturbationPredictor(make(seed), epochs=predictor_epochs, seed=seed))
                out += [{**base, "encoding": name, "seed": seed, "metric": m, "value": v} for m, v in res.items()]
    return out
