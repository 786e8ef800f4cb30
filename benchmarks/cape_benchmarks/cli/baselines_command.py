"""``cape-bench baselines``: the task baselines that need no transformer (annotation, clustering, perturbation)."""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cape._errors import CapeInputError
from cape._io import save_figure, write_json, write_text
from cape._tables import mean_sd_table
from cape.tasks.perturbation_predictors import (
    constant_gene_embeddings,
    dag_gene_embeddings,
    pca_gene_embeddings,
    permuted_gene_embeddings,
    random_gene_embeddings,
)

from ..baselines import run_annotation_baselines, run_clustering_baselines, run_perturbation_benchmark
from ._data import add_run_options, dataset_keys, dataset_name, load_dataset, perturbation_data

TASKS = ("annotation", "clustering", "perturbation")


def register(bench) -> None:
    p = bench.add_parser("baselines", help="task baselines: LR-on-PCA, PCA/ComBat/Harmony/Scanorama + k-means, "
                                           "no-change/additive/embedding/structural-equation perturbation "
                                           "predictors")
    p.add_argument("--task", choices=TASKS, required=True)
    p.add_argument("--dataset", required=True,
                   help="a registered dataset (cape data list), 'simulated' (perturbation) or an .h5ad path")
    p.add_argument("--label-key", default=None, help="obs column with labels (default: the dataset manifest's)")
    p.add_argument("--batch-key", default=None, help="obs column with batches (clustering; default: manifest's)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    add_run_options(p, "one seed, a smaller simulation, fewer epochs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    seeds = args.seeds[:1] if args.quick else args.seeds
    name = dataset_name(args.dataset)
    adata = load_dataset(args.dataset, args.task)
    if args.task in ("annotation", "clustering"):
        label_key, batch_key = dataset_keys(adata, args)
        if label_key is None:
            raise CapeInputError(f"dataset {name} has no label key in its manifest; pass --label-key")
        if args.task == "annotation":
            records = run_annotation_baselines(adata, label_key, dataset=name, seeds=seeds)
        else:
            records = run_clustering_baselines(adata, label_key, batch_key=batch_key, dataset=name, seeds=seeds)
        table = mean_sd_table(records, rows=["method"], columns=["metric"])
    else:
        records = _perturbation(adata, name, seeds, args.quick)
        table = mean_sd_table(records, rows=["metric", "method"], columns=["subgroup"], digits=3)
    out = Path(args.out)
    stem = out / f"baselines_{args.task}_{name}"
    write_json(records, stem.with_suffix(".json"))
    title = f"# Baselines: {args.task} on {name}\n\nmean ± sd over seeds {', '.join(map(str, seeds))}\n\n"
    write_text(title + table + "\n", stem.with_suffix(".md"))
    _plot(records, args.task, name, stem.with_suffix(".png"))
    return 0


def _perturbation(adata, name: str, seeds, quick: bool) -> list[dict]:
    adata = perturbation_data("simulated", quick, adata)
    d = min(16, adata.n_vars - 1)
    pca = pca_gene_embeddings(adata, d)
    embeddings = {f"pca{d}_control": pca, f"random{d}": random_gene_embeddings(adata.n_vars, d, seed=0)}
    if "true_dag" in adata.varp:
        embeddings[f"true_dag{d}"] = dag_gene_embeddings(adata.varp["true_dag"], d)
    # controls without gene knowledge: they must not beat no-change (constant) or the PCA rows (permuted)
    embeddings |= {"control_constant": constant_gene_embeddings(adata.n_vars, d),
                   "control_permuted": permuted_gene_embeddings(pca, seed=0)}
    kwargs = {"epochs": 150} if quick else {}
    # Structural-equation predictors fitted on the control cells only: Step I's graph with its learned equations
    # and refit by least squares, and (simulations) the true DAG refit the same way, the oracle.
    step1 = {"epochs": 30} if quick else {}
    scm = {"cape": {"equations": "learned", **step1}, "cape_graph": {"equations": "linear", **step1}}
    if "true_dag" in adata.varp:
        scm["true_dag"] = {"equations": "linear", "graph": adata.varp["true_dag"]}
    return run_perturbation_benchmark(adata, dataset=name, gene_embeddings=embeddings, seeds=seeds,
                                      predictor_kwargs=kwargs, scm=scm)


def _plot(records: list[dict], task: str, name: str, path: Path) -> None:
    matplotlib.use("agg")

    frame = pd.DataFrame(records).dropna(subset=["value"])
    if task == "perturbation":  # the plot shows the MSE; pearson_delta is in the table
        frame = frame[frame["metric"].str.endswith("_mse")]
    group = "subgroup" if task == "perturbation" else "metric"
    stats = frame.groupby(["method", group], sort=False)["value"].agg(["mean", "std"]).reset_index()
    methods = list(dict.fromkeys(stats["method"]))
    groups = list(dict.fromkeys(stats[group]))
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(groups) * max(1, len(methods)) / 3, 3.6))
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        sub = stats[stats["method"] == m].set_index(group).reindex(groups)
        ax.bar(np.arange(len(groups)) + i * width, sub["mean"], width, yerr=sub["std"].fillna(0), label=m,
               capsize=2)
    ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, groups)
    ylabel = "top-20 DE MSE (lower is better)" if task == "perturbation" else "score"
    ax.set_ylabel(ylabel)
    ax.set_title(f"{task} baselines on {name}")
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save_figure(fig, path)
    plt.close(fig)
