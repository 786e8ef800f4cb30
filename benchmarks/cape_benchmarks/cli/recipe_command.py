"""``cape-bench recipe``: the backbone's training recipe against the previous one, logistic regression on PCA and
PCA + k-means, over seeds with paired intervals (:mod:`cape_benchmarks.recipe`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd

from cape import pp
from cape._errors import CapeInputError
from cape._io import save_figure, write_json, write_text
from cape._tables import markdown_table, mean_sd_table
from cape.data.expression import simulate_expression

from ..recipe import RECIPES, ModelShape, paired_rows, recipe_settings, run_recipe_benchmark
from ._data import add_run_options, dataset_keys, dataset_name, load_dataset

#: The oligodendroglioma-shaped SMART-seq simulation (184 cells × 9,450 genes, TPM, fewer cells than genes).
TPM_DATASET = "simulated_tpm"

#: The workflow's preprocessing (configs/config.yaml), with ``min_genes`` at most a tenth of the genes.
PREPROCESS = {"min_genes": 200, "n_top_genes": 300}


def register(bench) -> None:
    p = bench.add_parser("recipe", help="the backbone's training recipe against the previous one and against "
                                        "LR-on-PCA / PCA + k-means, paired over seeds")
    p.add_argument("--dataset", default="pbmc68k_reduced",
                   help=f"a registered dataset (cape data list), simulated_grn (its quick size), {TPM_DATASET} or an "
                        ".h5ad path (raw or log-normalised; preprocessed as the workflow does) (pbmc68k_reduced)")
    p.add_argument("--label-key", default=None, help="obs column with labels (default: the dataset manifest's)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--recipes", nargs="+", choices=sorted(RECIPES), default=["current", "previous"],
                   help="recipes to train (current previous; long_schedule: the default before issue 55's shorter "
                        "fine-tuning at the accuracy's ceiling)")
    p.add_argument("--encoding", default=ModelShape.encoding,
                   help=f"positional encoding of every model ({ModelShape.encoding}: scGPT's own gene table, so "
                        "the recipe alone differs; CAPE's rows are `cape-bench encodings`)")
    add_run_options(p, "two seeds")
    p.set_defaults(func=run)


def load(name: str):
    """The dataset, preprocessed as the workflow does."""
    if name == TPM_DATASET:
        adata = simulate_expression(184, 9450, kind="tpm", seed=0)
    else:  # simulated_grn at its quick size (200 genes, 2,000 control cells in 5 types), the oracle's data
        adata = load_dataset(name, "annotation", quick=True)
    pp.preprocess(adata, min_genes=min(PREPROCESS["min_genes"], max(adata.n_vars // 10, 1)),
                  n_top_genes=PREPROCESS["n_top_genes"])
    return adata


def run(args: argparse.Namespace) -> int:
    seeds = args.seeds[:2] if args.quick else args.seeds
    name = dataset_name(args.dataset)
    adata = load(args.dataset)
    label_key = args.label_key or dataset_keys(adata, args)[0] or ("cell_type" if "cell_type" in adata.obs else None)
    if label_key is None:
        raise CapeInputError(f"dataset {name} has no label key in its manifest; pass --label-key")
    records = run_recipe_benchmark(adata, label_key, dataset=name, seeds=seeds, recipes=args.recipes,
                                   shape=ModelShape(encoding=args.encoding))
    stem = Path(args.out) / f"recipe_{name}"
    write_json(records, stem.with_suffix(".json"))
    write_text(markdown(records, name, seeds, args.encoding), stem.with_suffix(".md"))
    plot(records, name, stem.with_suffix(".png"))
    return 0


def markdown(records: list[dict], name: str, seeds, encoding: str) -> str:
    frame = pd.DataFrame(records)
    scores = frame[frame.metric.isin(["accuracy", "macro_f1", "ARI", "NMI", "seconds"])]
    means = mean_sd_table(scores.to_dict("records"), rows=["method"], columns=["metric"])
    paired = paired_rows(records)
    header = list(paired.columns)
    rows = [[f"{v:.3f}" if isinstance(v, float) else v for v in row] for row in paired.itertuples(index=False)]
    recipes = "\n".join(f"- `{k}`: " + ", ".join(f"{f} {v}" for f, v in r.items())
                         for k, r in recipe_settings().items())
    return (f"# Training recipe on {name}\n\nscGPT backbone, encoding `{encoding}`, seeds "
            f"{', '.join(map(str, seeds))}; each seed one 3:7 stratified split and one initialisation shared by "
            f"every row.\n\n{recipes}\n\n## Means over seeds\n\n{means}\n\n"
            "## Paired differences (95 % t interval over seeds; mdd: minimum detectable difference)\n\n"
            f"{markdown_table(header, rows)}\n\nClustering of a recipe with pretraining reads the pretrained "
            "`<cls>` embedding before any label (unsupervised); without pretraining, the fine-tuned embedding "
            "(supervised: it has seen the fine-tune labels).\n")


def plot(records: list[dict], name: str, path: Path) -> None:
    matplotlib.use("Agg")
    frame = pd.DataFrame(records)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, (task, metric) in zip(axes, (("annotation", "accuracy"), ("clustering", "ARI")), strict=True):
        sub = frame[(frame.task == task) & (frame.metric == metric)]
        wide = sub.pivot_table(index="seed", columns="method", values="value")
        for _, row in wide.iterrows():
            ax.plot(range(len(row)), row.to_numpy(), color="0.7", lw=0.8, marker="o", ms=3)
        ax.plot(range(len(wide.columns)), wide.mean().to_numpy(), color="k", lw=2, marker="o", label="mean")
        ax.set_xticks(range(len(wide.columns)), wide.columns, rotation=20)
        ax.set_ylabel(metric)
        ax.set_title(f"{task} on {name}")
    axes[0].legend(frameon=False)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
