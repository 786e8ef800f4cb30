"""The newcomer's first hour (issue 55), timed: the README's notebook block on a 3,000 × 2,000 raw-count matrix,
stage by stage, with the training schedule of today and the one before it in the same run, so that their ratio
holds on a shared machine.

``python -m cape_benchmarks.newcomer --out results/newcomer`` writes ``newcomer.h5ad`` (negative-binomial counts:
4 cell types with 50 marker genes each, one gene driving ten others), then ``newcomer.json`` with the seconds of
each stage per schedule, the load average before and after each run, the fine-tuning and pretraining epochs run
and the accuracy on all cells. The workflow on the same file is timed by Snakemake
(``snakemake --cores 2 --config input=<out>/newcomer.h5ad labels=cell_type``, ``logs/newcomer/*.tsv``).

For the issue's figure run it on an idle machine without ``nice``: torch's two threads wait for each other, so a
niced run slows several-fold whenever another job holds one of the two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

#: The schedules timed: the default, and the one before issue 55 (40 pretraining epochs, the full fine-tuning
#: patience at the accuracy's ceiling).
SCHEDULES = {"default": {"pretrain": {}, "train": {}},
             "long_schedule": {"pretrain": {"epochs": 40}, "train": {"early_stopping_ceiling_patience": None}}}


def newcomer_matrix(n_cells: int = 3000, n_genes: int = 2000, seed: int = 55) -> ad.AnnData:
    """Raw counts as a newcomer has them: 4 types with 50 markers each (6-fold), gene 0 driving genes 1–10."""
    rng = np.random.default_rng(seed)
    n_types = 4
    types = rng.integers(0, n_types, n_cells)
    log_mean = np.log(rng.lognormal(-1.0, 1.2, n_genes))[None, :].repeat(n_cells, 0)
    for t in range(n_types):
        log_mean[np.ix_(types == t, np.arange(100 + 50 * t, 150 + 50 * t))] += np.log(6.0)
    hub = rng.normal(0, 0.6, n_cells)
    log_mean[:, 0] += hub
    log_mean[:, 1:11] += 0.8 * hub[:, None]
    mu = np.exp(log_mean) * rng.lognormal(0, 0.3, n_cells)[:, None]
    counts = rng.negative_binomial(2.0, 2.0 / (2.0 + mu))
    adata = ad.AnnData(sp.csr_matrix(counts.astype(np.float32)))
    adata.obs_names = [f"cell{i}" for i in range(n_cells)]
    adata.var_names = [f"GENE{j}" for j in range(n_genes)]
    adata.obs["cell_type"] = pd.Categorical([f"type{t}" for t in types])
    return adata


def readme_block(path: Path, schedule: dict) -> dict:
    """The README's notebook block on ``path`` (its downstream one-liners aside): seconds per stage."""
    import matplotlib

    matplotlib.use("Agg")
    import cape

    seconds: dict[str, float] = {}
    start = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal start
        seconds[name] = round(time.perf_counter() - start, 1)
        start = time.perf_counter()

    adata = cape.data.read(path)
    cape.pp.preprocess(adata)
    lap("read+preprocess")
    cape.tl.causal_graph(adata)
    lap("causal_graph")
    cape.tl.hyperbolic_embedding(adata)
    cape.tl.rotary_encoding(adata)
    cape.pl.dag(adata, show=False), cape.pl.poincare(adata, show=False), cape.pl.generality(adata, show=False)
    cape.tl.predict_intervention(adata, {adata.var_names[0]: "ko"})
    cape.pl.intervention(adata, show=False)
    lap("steps II-III, plots, intervention")
    model = cape.models.CellTransformer(adata, architecture="scgpt", encoding="cape")
    pretrain = model.pretrain(adata, **schedule["pretrain"])
    lap("pretrain")
    fit = model.train(adata, "cell_type", **schedule["train"])
    lap("train")
    model.predict(adata, key_added="prediction")
    model.embed(adata)
    lap("predict+embed")
    accuracy = float((adata.obs["prediction"].astype(str) == adata.obs["cell_type"].astype(str)).mean())
    return {"seconds": seconds, "total": round(sum(seconds.values()), 1), "pretrain_epochs": len(pretrain),
            "fine_tune_epochs": len(fit), "accuracy_all_cells": accuracy,
            "n_edges": int(adata.uns["cape"]["causal_graph"]["n_edges"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/newcomer")
    parser.add_argument("--schedules", nargs="+", choices=sorted(SCHEDULES), default=list(SCHEDULES))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "newcomer.h5ad"
    if not path.exists():
        newcomer_matrix().write_h5ad(path)
    runs = {}
    for name in args.schedules:
        before = os.getloadavg()
        runs[name] = readme_block(path, SCHEDULES[name]) | {"loadavg_before": before, "loadavg_after": os.getloadavg()}
        print(name, json.dumps(runs[name]), flush=True)
    (out / "newcomer.json").write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
