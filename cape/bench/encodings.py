"""``cape bench encodings``: every positional encoding × both backbones × seeds on one task, plus CAPE's ablations
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
  (clustering), no-change and additive predictors (perturbation).
* scBERT's Performer attention cannot add logit biases: bias/attention encodings are skipped there, noted in the
  table and the records (``kind = "skipped"``).

Records (``<task>_<dataset>.json``): ``task, dataset, backbone, encoding, seed, metric, value`` plus ``kind``
(``model``, ``baseline``, ``positions``, ``skipped``), the registry encoding and position set behind each row, and
seconds. The markdown table gives mean ± sd over seeds and, in parentheses, the difference to the backbone's
default encoding (scGPT: ``trainable_absolute``, scBERT: ``static_absolute``).
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

from .. import encodings
from .._errors import CapeInputError
from .._io import save_figure, write_json, write_text
from ..tasks.annotation import annotation_metrics, annotation_split, fine_tune_cells, logistic_regression_pca, roles
from ..tasks.clustering import cluster_embedding, clustering_metrics, kmeans_clusters, pca_embedding
from ..tasks.labels import checked_labels
from ..tasks.perturbation import PerturbationTask
from ..tasks.perturbation_predictors import AdditivePredictor, EmbeddingPerturbationPredictor, NoChangePredictor

logger = logging.getLogger("cape")

TASKS = ("annotation", "clustering", "perturbation")
BACKBONES = ("scgpt", "scbert")
DEFAULT_ENCODING = {"scgpt": "trainable_absolute", "scbert": "static_absolute"}
# ablation name -> (registry encoding, position set); position sets are built by :func:`position_sets`.
ABLATIONS = {
    "cape_null": ("none", "none"),
    "cape_wo_csl": ("cape", "correlation"),
    "cape_wo_hyperbolic": ("cape", "euclidean"),
    "cape_wo_rotary": ("cape_additive", "cape"),
}
POSITION_SETS = ("cape", "correlation", "euclidean")  # plus "none": the expression data without Steps I-III
METRICS = {
    "annotation": ("accuracy", "macro_f1"),
    "clustering": ("ARI", "NMI", "ASW"),
    "perturbation": ("mse_single", "mse_double", "mse_combo_seen0", "mse_combo_seen1", "mse_combo_seen2",
                     "mse_overall"),
}
LOWER_IS_BETTER = {m for m in METRICS["perturbation"]}


@dataclass(frozen=True)
class Variant:
    """One table row: a name, the registry encoding it runs and the position set it reads."""

    name: str
    encoding: str
    positions: str = "cape"  # "cape", "correlation", "euclidean" or "none"


def variants(names: Sequence[str] | None = None) -> list[Variant]:
    """The rows to run: registry encodings by name, ablations by their names (default: all of both)."""
    known = [*encodings.available(), *ABLATIONS]
    names = list(dict.fromkeys(names)) if names else known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise CapeInputError(f"unknown encoding(s) {', '.join(unknown)}; available: {', '.join(known)}")
    return [Variant(n, *ABLATIONS[n]) if n in ABLATIONS else Variant(n, n, _position_set(n)) for n in names]


def _position_set(encoding: str) -> str:
    """``"cape"`` when the encoding reads Steps I–III's keys, ``"none"`` when it needs no gene positions."""
    requires = encodings.get_class(encoding).requires
    return "none" if requires in (None, "values", "co_expression") else "cape"


def skip_reason(backbone: str, variant: Variant) -> str | None:
    """Why ``variant`` cannot run in ``backbone`` (None when it can): Performer attention has no logits."""
    if backbone == "scbert" and encodings.get_class(variant.encoding).provides & {"bias", "attention"}:
        return f"{variant.encoding} adds to the attention logits, which scBERT's Performer never forms"
    return None


@dataclass(frozen=True)
class BenchSettings:
    """Sizes and epochs of one benchmark run; :meth:`for_mode` gives the full and the ``--quick`` presets."""

    n_genes: int = 500
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    max_len: int = 256
    batch_size: int = 32
    lr: float = 1e-3
    pretrain_epochs: int = 5
    # Annotation follows `cape train`'s recipe: no masked-value pretraining (it lowered validation accuracy on
    # pbmc68k_reduced), up to ``fine_tune_epochs`` with early stopping on 20 % of the fine-tune cells.
    annotation_pretrain_epochs: int = 0
    fine_tune_epochs: int = 100
    fine_tune_patience: int = 15
    patience: int = 5
    dropout: float = 0.0
    causal_epochs: int = 100
    causal_tau: float = 0.2  # the paper's τ (Step I keeps ~120 edges among 300 pbmc68k_reduced genes)
    causal_rank: int = 40
    embed_dim: int = 8
    embed_epochs: int = 1000
    corr_neighbors: int = 5
    predictor_epochs: int = 400

    @classmethod
    def for_mode(cls, quick: bool, **overrides) -> BenchSettings:
        # embed_dim = head_dim / 2, so that encodings sharing one set of rotary planes across heads (tape) fit
        base = cls(n_genes=200, d_model=32, n_layers=2, n_heads=2, max_len=64, pretrain_epochs=3,
                   fine_tune_epochs=40, fine_tune_patience=10, patience=5, causal_epochs=100, embed_dim=8,
                   embed_epochs=300, predictor_epochs=150) if quick else cls(pretrain_epochs=10)
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})


# ----------------------------------------------------------------------------------------------------------------
# data and positions
# ----------------------------------------------------------------------------------------------------------------
def prepare_expression(adata: ad.AnnData, n_genes: int) -> ad.AnnData:
    """Dense-safe, non-negative, log-scale copy restricted to the ``n_genes`` most dispersed genes (scanpy seurat).

    Small negative values (krumsiek11's simulation noise) are clipped to 0 with a log line: the backbones bin
    non-negative log expression.
    """
    import scanpy as sc

    out = adata.copy()
    x = out.X
    data = x.data if sp.issparse(x) else np.asarray(x)
    if data.size and np.nanmin(data) < 0:
        logger.info("clipping %d negative expression values to 0", int((data < 0).sum()))
        if sp.issparse(x):
            x = x.copy()
            x.data = np.clip(x.data, 0, None)
            out.X = x
        else:
            out.X = np.clip(np.asarray(x, dtype=np.float32), 0, None)
    if out.n_vars > n_genes:
        tmp = out.copy()
        tmp.uns.pop("log1p", None)
        sc.pp.highly_variable_genes(tmp, n_top_genes=n_genes, flavor="seurat")
        out = out[:, tmp.var["highly_variable"].to_numpy()].copy()
    out.var["cape_used"] = True
    return out


def correlation_graph(x, k: int = 5) -> sp.csr_matrix:
    """Gene similarity graph for CAPE-w/o-CSL: each gene joined to its ``k`` most |Pearson|-correlated genes,
    weight |r| (the paper's "undirected similar matrix").

    Step II embeds a DAG, so each undirected edge is oriented by a causality-agnostic total order: from the gene
    with the larger weighted degree (similarity hub) to the smaller, ties by column index. The result is acyclic
    and carries no causal direction learnt from the data.
    """
    x = np.asarray(x.toarray() if sp.issparse(x) else x, dtype=np.float64)
    sd = x.std(axis=0)
    z = (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    corr = np.abs(z.T @ z / max(x.shape[0], 1))
    np.fill_diagonal(corr, 0.0)
    corr[:, sd <= 0] = 0.0
    corr[sd <= 0, :] = 0.0
    n = corr.shape[0]
    k = min(k, n - 1)
    rows = np.repeat(np.arange(n), k)
    cols = np.argsort(-corr, axis=1)[:, :k].ravel()
    w = corr[rows, cols]
    keep = w > 0
    a = sp.csr_matrix((w[keep], (rows[keep], cols[keep])), shape=(n, n))
    a = a.maximum(a.T).tocoo()  # undirected similarity
    degree = np.asarray(a.sum(axis=1)).ravel()
    rank = np.empty(n, dtype=np.int64)
    rank[np.lexsort((np.arange(n), -degree))] = np.arange(n)  # 0 = largest weighted degree
    forward = rank[a.row] < rank[a.col]
    return sp.csr_matrix((a.data[forward], (a.row[forward], a.col[forward])), shape=(n, n))


def position_sets(adata: ad.AnnData, needed: Sequence[str], settings: BenchSettings, *, seed: int = 0,
                  device: str | None = None) -> tuple[dict[str, ad.AnnData], list[dict]]:
    """Steps I–III once per position set: ``cape`` (causal DAG → hyperbolic → rotary), ``euclidean`` (the same DAG
    embedded in Euclidean space by plain SGD) and ``correlation`` (|corr| kNN graph → hyperbolic → rotary).

    Returns ``{set name: AnnData with the set's var/varm/varp keys}`` and timing records.
    """
    from .. import tl

    needed = [s for s in POSITION_SETS if s in set(needed)]
    out: dict[str, ad.AnnData] = {}
    timings: list[dict] = []
    embed = {"dim": settings.embed_dim, "epochs": settings.embed_epochs, "device": device or "auto", "seed": seed}
    if {"cape", "euclidean"} & set(needed):
        base = adata.copy()
        start = time.perf_counter()
        tl.causal_graph(base, rank=settings.causal_rank, tau=settings.causal_tau, epochs=settings.causal_epochs,
                        device=device or "auto", seed=seed, use_genes=None)
        step1 = time.perf_counter() - start
        n_edges = int(base.varp["cape_dag"].nnz)
        if n_edges == 0:
            logger.warning("Step I kept no edge above tau=%g: every gene sits at the origin, so CAPE positions "
                           "carry no information in this run (lower --causal-tau or train Step I longer)",
                           settings.causal_tau)
        timings += [{"position_set": "cape", "step": "I_causal_graph", "metric": "seconds", "value": step1},
                    {"position_set": "cape", "step": "I_causal_graph", "metric": "n_edges", "value": n_edges}]
        for name, geometry in (("cape", "hyperbolic"), ("euclidean", "euclidean")):
            if name not in needed:
                continue
            pos = base.copy()
            start = time.perf_counter()
            # optimizer "rsgd" is Riemannian SGD on the hyperboloid and plain SGD in Euclidean space (paper's ablation)
            tl.hyperbolic_embedding(pos, geometry=geometry, optimizer="rsgd", **embed)
            tl.rotary_encoding(pos)
            timings.append({"position_set": name, "step": "II_III_embedding", "metric": "seconds",
                            "value": time.perf_counter() - start})
            out[name] = pos
    if "correlation" in needed:
        pos = adata.copy()
        start = time.perf_counter()
        graph = correlation_graph(pos.X, k=settings.corr_neighbors)
        seconds_graph = time.perf_counter() - start
        tl.hyperbolic_embedding(pos, adjacency=graph, geometry="hyperbolic", optimizer="rsgd", **embed)
        tl.rotary_encoding(pos)
        # varp["cape_dag"] stays absent: encodings reading a DAG must not see the similarity graph as causal
        pos.uns["cape"]["correlation_graph"] = {"k": settings.corr_neighbors, "n_edges": int(graph.nnz)}
        timings += [{"position_set": "correlation", "step": "I_correlation_graph", "metric": "seconds",
                     "value": seconds_graph},
                    {"position_set": "correlation", "step": "I_correlation_graph", "metric": "n_edges",
                     "value": int(graph.nnz)},
                    {"position_set": "correlation", "step": "II_III_embedding", "metric": "seconds",
                     "value": time.perf_counter() - start - seconds_graph}]
        out["correlation"] = pos
    return out, timings


# ----------------------------------------------------------------------------------------------------------------
# one model
# ----------------------------------------------------------------------------------------------------------------
def build_model(data: ad.AnnData, backbone: str, variant: Variant, settings: BenchSettings, seed: int,
                device: str | None = None):
    """A :class:`~cape.models.CellTransformer` for ``variant`` on ``data`` (which carries the position keys)."""
    from ..models import CellTransformer

    return CellTransformer(data, backbone, variant.encoding, d_model=settings.d_model, n_layers=settings.n_layers,
                           n_heads=settings.n_heads, max_len=settings.max_len, dropout=settings.dropout, seed=seed,
                           device=device or "auto")


def _pretrain(model, data: ad.AnnData, settings: BenchSettings, epochs: int | None = None) -> None:
    epochs = settings.pretrain_epochs if epochs is None else epochs
    if epochs > 0:
        model.pretrain(data, epochs=epochs, batch_size=settings.batch_size, lr=settings.lr,
                       validation_fraction=0.1, early_stopping_patience=settings.patience)


def annotation_run(model, data: ad.AnnData, labels: pd.Series, split, settings: BenchSettings) -> dict[str, float]:
    """Pretrain on every cell (no labels), fine-tune on the split's fine-tune cells, score its test cells."""
    _pretrain(model, data, settings, settings.annotation_pretrain_epochs)
    fine_tune = fine_tune_cells(data, roles(data, labels, split), labels, "_label")
    model.train(fine_tune, "_label", epochs=settings.fine_tune_epochs, batch_size=settings.batch_size,
                lr=settings.lr, validation_fraction=0.2, early_stopping_patience=settings.fine_tune_patience)
    predicted = model.predict(data[labels.index][split.test])
    return annotation_metrics(labels.to_numpy()[split.test], np.asarray(predicted))


def clustering_run(model, data: ad.AnnData, labels: pd.Series, settings: BenchSettings, seed: int
                   ) -> dict[str, float]:
    """Pretrain (no labels), embed cells, k-means with k = number of labels; ARI, NMI, ASW."""
    _pretrain(model, data, settings)  # no labels here: masked-value pretraining is all the model learns
    cells = data[labels.index].copy()
    cells.obs["_label"] = labels.to_numpy()
    model.embed(cells, gene_key=None)
    result = cluster_embedding(cells, "_label", seed=seed)
    return {k: v for k, v in result.items() if k != "k"}


def perturbation_run(model, task: PerturbationTask, control: ad.AnnData, settings: BenchSettings, seed: int
                     ) -> dict[str, float]:
    """Pretrain on control cells, contextual gene embeddings → embedding predictor → top-20 DE MSE."""
    _pretrain(model, control, settings)
    emb = control.copy()
    model.embed(emb, key_added="_cells", gene_key="_genes")
    genes = pd.DataFrame(emb.varm["_genes"], index=emb.var_names).reindex(task.adata.var_names).fillna(0.0)
    predictor = EmbeddingPerturbationPredictor(genes.to_numpy(), epochs=settings.predictor_epochs, seed=seed)
    return task.score(predictor)


# ----------------------------------------------------------------------------------------------------------------
# runner
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class BenchmarkResult:
    records: list[dict]
    settings: BenchSettings
    seconds: float
    paths: dict[str, Path]
    cpu_seconds: float = float("nan")  # this process's CPU time: comparable across machine loads


def run_encodings_benchmark(adata: ad.AnnData, task: str, *, dataset: str = "data", label_key: str | None = None,
                            encoding_names: Sequence[str] | None = None,
                            backbones: Sequence[str] = BACKBONES, seeds: Sequence[int] = (0, 1, 2),
                            quick: bool = False, settings: BenchSettings | None = None,
                            out: str | Path | None = "results/bench", name: str | None = None,
                            positions_seed: int = 0, threads: int | None = 1, device: str | None = None,
                            jobs: int = 1) -> BenchmarkResult:
    """Run every variant × backbone × seed on ``task`` and write ``<out>/<name>.{json,md,png}``.

    ``name`` defaults to ``<task>_<dataset>``; ``out=None`` writes nothing. ``threads`` sets torch's intra-op
    threads for the run (``None`` leaves it). ``positions_seed`` seeds Steps I–III, shared by every seed.
    ``jobs`` > 1 trains that many models at once in worker processes (each with ``threads`` threads; Steps I–III
    and the baselines still run once, here); every model is seeded, so the records do not depend on ``jobs``.
    """
    import torch


    if task not in TASKS:
        raise CapeInputError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    bad = [b for b in backbones if b not in BACKBONES]
    if bad or not backbones:
        raise CapeInputError(f"unknown backbone(s) {', '.join(bad) or '(none)'}; choose from {', '.join(BACKBONES)}")
    if not seeds:
        raise CapeInputError("at least one seed is needed")
    if jobs < 1:
        raise CapeInputError(f"jobs must be at least 1, got {jobs}")
    rows = variants(encoding_names)
    settings = settings or BenchSettings.for_mode(quick)
    start_all, cpu_start = time.perf_counter(), time.process_time()
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
        records += _baselines(task, data, labels, ptask, seeds, dataset)
        splits = {s: annotation_split(labels, seed=s) for s in seeds} if task == "annotation" else {}
        # Plan every (backbone, variant, seed); a model identical to an earlier one (cape_null = none) runs once.
        plan: list[tuple[str, Variant, int | None, tuple | None, str | None]] = []
        unique: dict[tuple, tuple[str, Variant, int]] = {}
        for backbone in backbones:
            for variant in rows:
                reason = skip_reason(backbone, variant)
                if reason:
                    plan.append((backbone, variant, None, None, reason))
                    continue
                for seed in seeds:
                    key = (backbone, variant.encoding, variant.positions, seed)
                    unique.setdefault(key, (backbone, variant, seed))
                    plan.append((backbone, variant, seed, key, None))
        context = _RunContext(task, sets, labels, splits, ptask, settings, device, threads)
        outcomes = _run_models(context, unique, jobs)
        first_of: dict[tuple, str] = {}
        failed: set[tuple[str, str]] = set()
        for backbone, variant, seed, key, reason in plan:
            if reason is not None:
                logger.info("skipping %s on %s: %s", variant.name, backbone, reason)
                records.append({**base, "kind": "skipped", "backbone": backbone, "encoding": variant.name,
                                "seed": None, "metric": "skipped", "value": None, "reason": reason})
                continue
            if (backbone, variant.name) in failed:
                continue
            values, seconds, error = outcomes[key]
            if error is not None:  # e.g. positions wider than the heads' rotary planes: the same for every seed
                logger.warning("%s on %s not run: %s", variant.name, backbone, error)
                records.append({**base, "kind": "skipped", "backbone": backbone, "encoding": variant.name,
                                "seed": None, "metric": "skipped", "value": None, "reason": error})
                failed.add((backbone, variant.name))
                continue
            extra = {"same_run_as": first_of[key]} if key in first_of else {}
            if not extra:
                first_of[key] = variant.name
                logger.info("%s %s/%s seed %d: %s (%.1f s)", task, backbone, variant.name, seed,
                            ", ".join(f"{k} {v:.4f}" for k, v in values.items()), seconds)
            records += [{**base, "kind": "model", "backbone": backbone, "encoding": variant.name,
                         "seed": seed, "metric": m, "value": v, "registry_encoding": variant.encoding,
                         "position_set": variant.positions, "seconds": seconds, **extra}
                        for m, v in values.items()]
    finally:
        torch.set_num_threads(previous)
    seconds = time.perf_counter() - start_all
    result = BenchmarkResult(records, settings, seconds, {}, time.process_time() - cpu_start)
    if out is not None:
        out = Path(out)
        stem = out / (name or f"{task}_{dataset}")
        out.mkdir(parents=True, exist_ok=True)
        info = {"n_cells": data.n_obs, "n_genes": data.n_vars, "seeds": list(seeds), "quick": quick,
                "threads": threads, "cpu_count": len(os.sched_getaffinity(0)), "machine": platform.machine(),
                "load_average": os.getloadavg()[0]}
        result.paths = {"json": write_json(records, stem.with_suffix(".json")),
                        "md": write_text(markdown_report(result, task, dataset, info), stem.with_suffix(".md")),
                        "png": stem.with_suffix(".png")}
        plot_results(records, task, dataset, result.paths["png"])
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


def _model_outcome(context: _RunContext, backbone: str, variant: Variant, seed: int
                   ) -> tuple[dict[str, float] | None, float, str | None]:
    """Train and score one model: (metric values, seconds, None), or (None, 0, reason) if it cannot be built."""
    t0 = time.perf_counter()
    pos_data = context.sets[variant.positions]
    try:
        model = build_model(pos_data, backbone, variant, context.settings, seed, context.device)
    except CapeInputError as err:
        return None, 0.0, str(err)
    if context.task == "perturbation":
        values = perturbation_run(model, context.ptask, pos_data, context.settings, seed)
    elif context.task == "annotation":
        values = annotation_run(model, pos_data, context.labels, context.splits[seed], context.settings)
    else:
        values = clustering_run(model, pos_data, context.labels, context.settings, seed)
    return values, time.perf_counter() - t0, None


_WORKER_CONTEXT: _RunContext | None = None


def _worker_init(context: _RunContext) -> None:
    import torch

    from .._settings import settings as cape_settings

    global _WORKER_CONTEXT
    _WORKER_CONTEXT = context
    if context.threads:
        torch.set_num_threads(context.threads)
    # The parent logs each result and shows one bar over the models; per-epoch bars of parallel runs would interleave.
    logging.getLogger("cape").setLevel(logging.WARNING)
    cape_settings.progress = False


def _worker_run(job: tuple[str, Variant, int]):
    assert _WORKER_CONTEXT is not None
    return _model_outcome(_WORKER_CONTEXT, *job)


def _run_models(context: _RunContext, unique: dict[tuple, tuple[str, Variant, int]], jobs: int) -> dict:
    """Outcome of every distinct model, in this process (``jobs`` = 1) or in a pool of worker processes."""
    if jobs == 1 or len(unique) <= 1:
        return {key: _model_outcome(context, *job) for key, job in unique.items()}
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from .._progress import progress

    # "spawn": a forked child would inherit torch's thread pools and locks from this process.
    with ProcessPoolExecutor(max_workers=min(jobs, len(unique)), mp_context=mp.get_context("spawn"),
                             initializer=_worker_init, initargs=(context,)) as pool:
        futures = {key: pool.submit(_worker_run, job) for key, job in unique.items()}
        for _ in progress(as_completed(futures.values()), desc="models", total=len(futures)):
            pass
        return {key: future.result() for key, future in futures.items()}


def _baselines(task: str, data: ad.AnnData, labels, ptask, seeds, dataset: str) -> list[dict]:
    base = {"task": task, "dataset": dataset, "kind": "baseline", "backbone": "baseline"}
    out = []
    if task == "annotation":
        cells = data[labels.index].copy()
        cells.obs["_label"] = labels.to_numpy()
        for seed in seeds:
            res = logistic_regression_pca(cells, "_label", seed=seed, split=annotation_split(labels, seed=seed))
            out += [{**base, "encoding": "logreg_pca50", "seed": seed, "metric": m, "value": res[m]}
                    for m in METRICS["annotation"]]
    elif task == "clustering":
        emb = pca_embedding(np.asarray(data.X.toarray() if sp.issparse(data.X) else data.X, dtype=np.float64),
                            50)
        for seed in seeds:
            res = clustering_metrics(emb, labels.to_numpy(), kmeans_clusters(emb, labels.nunique(), seed=seed))
            out += [{**base, "encoding": "pca_kmeans", "seed": seed, "metric": m, "value": v} for m, v in res.items()]
    else:
        for predictor in (NoChangePredictor(), AdditivePredictor()):
            res = ptask.score(predictor)  # deterministic: once
            out += [{**base, "encoding": predictor.name, "seed": None, "metric": m, "value": v} for m, v in res.items()]
    return out


# ----------------------------------------------------------------------------------------------------------------
# tables and plot
# ----------------------------------------------------------------------------------------------------------------
def summary_frame(records: Sequence[dict]) -> pd.DataFrame:
    """Mean, sd and count per (backbone, encoding, metric) over seeds, for model and baseline rows."""
    frame = pd.DataFrame([r for r in records if r.get("kind") in ("model", "baseline")])
    if frame.empty:
        raise CapeInputError("the benchmark produced no model or baseline records")
    frame["value"] = frame["value"].astype(float)
    return (frame.groupby(["backbone", "encoding", "metric"], sort=False)["value"]
            .agg(["mean", "std", "count"]).reset_index())


def results_table(records: Sequence[dict], task: str, metrics: Sequence[str] | None = None, digits: int = 3
                  ) -> str:
    """Markdown in the paper tables' shape: rows backbone × encoding, ``mean ± sd (Δ to the default)``."""
    stats = summary_frame(records)
    measured = set(stats.loc[stats["mean"].notna(), "metric"])
    metrics = [m for m in (metrics or METRICS[task]) if m in measured]
    lines = ["| backbone | encoding | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for backbone in dict.fromkeys(stats["backbone"]):
        sub = stats[stats["backbone"] == backbone]
        default = DEFAULT_ENCODING.get(backbone)
        ref = sub[sub["encoding"] == default].set_index("metric")["mean"] if default else pd.Series(dtype=float)
        for enc in dict.fromkeys(sub["encoding"]):
            row = sub[sub["encoding"] == enc].set_index("metric")
            cells = []
            for m in metrics:
                if m not in row.index or pd.isna(row.loc[m, "mean"]):
                    cells.append("–")
                    continue
                mean, sd, n = row.loc[m, "mean"], row.loc[m, "std"], row.loc[m, "count"]
                cell = f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if n > 1 and not pd.isna(sd) else "")
                if enc != default and m in ref.index and not pd.isna(ref[m]):
                    cell += f" ({mean - ref[m]:+.{digits}f})"
                cells.append(cell)
            label = f"{enc} †" if enc == default else enc
            lines.append(f"| {backbone} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_report(result: BenchmarkResult, task: str, dataset: str, info: dict) -> str:
    records = result.records
    s = result.settings
    title = {"annotation": "cell-type annotation (paper Table S1)", "clustering": "cell clustering (Table S2)",
             "perturbation": "perturbation prediction (Tables 2-3)"}[task]
    seeds = ", ".join(map(str, info["seeds"]))
    better = "lower is better" if task == "perturbation" else "higher is better"
    parts = [f"# Positional encodings: {title} on {dataset}", "",
             f"mean ± sd over seeds {seeds} ({better}); in parentheses the difference to the backbone's default "
             "encoding (†: scGPT trainable_absolute, scBERT static_absolute). Baselines ran in the same run on the "
             "same data" + (", on the same 30/70 split per seed." if task == "annotation" else "."), "",
             results_table(records, task), ""]
    skipped = [r for r in records if r.get("kind") == "skipped"]
    if skipped:
        parts += ["Not run: " + "; ".join(f"{r['encoding']} on {r['backbone']} ({r['reason']})" for r in skipped)
                  + ".", ""]
    pos = [r for r in records if r.get("kind") == "positions"]
    if pos:
        parts += ["Positions (computed once, seed "
                  f"{pos[0]['seed']}, shared by every seed and encoding): "
                  + "; ".join(f"{r['position_set']} {r['step']} {r['metric']} = "
                              + (f"{r['value']:.1f}" if r["metric"] == "seconds" else f"{int(r['value'])}")
                              for r in pos) + ".", ""]
    parts += [f"Data: {info['n_cells']} cells × {info['n_genes']} genes. Backbones: d_model {s.d_model}, "
              f"{s.n_layers} layers, {s.n_heads} heads, ≤ {s.max_len} tokens/cell, batch {s.batch_size}, lr {s.lr}; "
              f"dropout {s.dropout}; {_pretrain_note(task, s)}; {_task_note(task, s)} Step I: {s.causal_epochs} "
              f"epochs, rank {s.causal_rank}, τ {s.causal_tau}; Step II: d {s.embed_dim}, {s.embed_epochs} epochs; "
              f"w/o-CSL graph: |corr| {s.corr_neighbors}-NN. "
              f"Wall time {result.seconds / 60:.1f} min (CPU time {result.cpu_seconds / 60:.1f} min) on "
              f"{info['cpu_count']} CPU core(s) ({info['machine']}, "
              f"{info['threads']} torch thread(s), 1-min load average at the end {info['load_average']:.1f})"
              + (" — quick mode." if info["quick"] else "."), ""]
    return "\n".join(parts)


def _pretrain_note(task: str, s: BenchSettings) -> str:
    epochs = s.annotation_pretrain_epochs if task == "annotation" else s.pretrain_epochs
    if epochs == 0:
        return "no masked-value pretraining"
    return f"pretraining {epochs} epochs (masked values, early stopping patience {s.patience} on 10 % of the cells)"


def _task_note(task: str, s: BenchSettings) -> str:
    if task == "annotation":
        return (f"fine-tuning ≤ {s.fine_tune_epochs} epochs on the 30 % split (class-balanced loss, mean pooling, "
                f"early stopping with patience {s.fine_tune_patience} on 20 % of it, never on test cells).")
    if task == "clustering":
        return "no label fine-tuning: k-means (k = number of labels) on the <cls> embedding."
    return (f"pretrained on control cells only; contextual gene embeddings → embedding predictor "
            f"({s.predictor_epochs} epochs); GEARS simulation split, seed 1.")


def plot_results(records: Sequence[dict], task: str, dataset: str, path: str | Path) -> Path:
    """Bars per encoding (mean ± sd over seeds), one panel per backbone × headline metric; baselines as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = summary_frame(records)
    measured = set(stats.loc[stats["mean"].notna(), "metric"])  # e.g. no doubles in Sachs 2005
    metrics = [m for m in METRICS[task][: 2 if task == "perturbation" else 3] if m in measured]
    backbones = [b for b in dict.fromkeys(stats["backbone"]) if b != "baseline"]
    base = stats[stats["backbone"] == "baseline"]
    fig, axes = plt.subplots(len(metrics), max(len(backbones), 1),
                             figsize=(5.5 * max(len(backbones), 1), 2.8 * len(metrics)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    handles: dict = {}
    for j, backbone in enumerate(backbones):
        sub = stats[stats["backbone"] == backbone]
        encs = list(dict.fromkeys(sub["encoding"]))
        for i, m in enumerate(metrics):
            ax = axes[i, j]
            row = sub[sub["metric"] == m].set_index("encoding").reindex(encs)
            color = ["tab:red" if e.startswith("cape") else
                     ("tab:gray" if e == DEFAULT_ENCODING.get(backbone) else "tab:blue") for e in encs]
            sd = row["std"].where(row["count"] > 1)
            ax.bar(range(len(encs)), row["mean"], yerr=None if sd.isna().all() else sd.fillna(0), color=color,
                   capsize=2)
            for k, (bname, bsub) in enumerate(base[base["metric"] == m].groupby("encoding", sort=False)):
                line = ax.axhline(bsub["mean"].iloc[0], ls="--", lw=1, color=colors[(k + 2) % len(colors)])
                handles.setdefault(bname, line)
            finite = row["mean"].dropna()
            if len(finite):
                lo, hi = finite.min(), finite.max()
                lo = min([lo, *base[base["metric"] == m]["mean"]])
                hi = max([hi, *base[base["metric"] == m]["mean"]])
                pad = 0.15 * (hi - lo) + 1e-3
                ax.set_ylim(max(lo - pad, 0 if lo >= 0 else lo - pad), hi + pad)
            ax.set_xticks(range(len(encs)), encs, rotation=60, ha="right", fontsize=7)
            ax.set_ylabel(m + (" (↓)" if m in LOWER_IS_BETTER else " (↑)"))
            ax.set_title(f"{backbone}: {m}", fontsize=9)
    fig.suptitle(f"{task} on {dataset}: grey = backbone's default encoding, red = CAPE and its ablations; "
                 "dashed = baselines", fontsize=10)
    fig.tight_layout()
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="upper right", fontsize=7, frameon=False,
                   bbox_to_anchor=(1.0, 1.0))
    save_figure(fig, path)
    plt.close(fig)
    return Path(path)
