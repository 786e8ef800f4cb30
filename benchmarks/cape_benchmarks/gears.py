"""``cape-bench gears``: plain GEARS vs GEARS fed CAPE's gene positions vs control embeddings (PCA of control cells,
random), on the same split and metric as the other perturbation benchmarks; records, a markdown table and a plot.
The adapter itself is :mod:`cape.tasks.gears`."""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import anndata as ad
import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

from cape import tl
from cape._errors import CapeInputError
from cape._io import save_figure, write_json, write_text
from cape.tasks.gears import mse_excluding_targets, run_gears
from cape.tasks.gears_inputs import _import_gears
from cape.tasks.perturbation import (
    PerturbationTask,
)
from cape.tasks.perturbation_predictors import pca_gene_embeddings, random_gene_embeddings, simple_baselines

from .encodings_models import BenchSettings, position_sets, prepare_expression

logger = logging.getLogger("cape")

ARMS = ("plain", "cape", "pca", "random", "cape_oracle")
DEFAULT_ARMS = ("plain", "cape", "pca", "random")
ARM_NOTES = {
    "plain": "GEARS' own random, trainable gene and perturbation embeddings",
    "cape": "CAPE's Poincaré-ball gene positions (Steps I–III on the control cells)",
    "pca": "PCA gene loadings of the control cells (same width as CAPE's positions)",
    "random": "Gaussian random gene embeddings (same width; a new draw per seed)",
    "cape_oracle": ("Steps II–III run on the data's known DAG instead of Step I's (an upper reference for CAPE's "
                    "geometry, not a method: it needs the true graph)"),
}
METRICS = ("mse_overall", "mse_single", "mse_double", "mse_combo_seen0", "mse_combo_seen1", "mse_combo_seen2",
           "mse_overall_excl_targets")
KNOWN_GRAPH_KEYS = ("true_dag", "true_graph")  # simulate_perturbation, Sachs 2005 consensus network


def resolve_go_graph(choice, adata: ad.AnnData, cape_positions: ad.AnnData | None = None):
    """The ``go_graph`` argument for a benchmark choice: ``known`` (the dataset's known graph, ``varp["true_dag"]``
    or ``varp["true_graph"]``), ``cape_dag`` (Step I's learnt DAG), ``empty`` (no gene similarity: only self-loops,
    so unseen genes' perturbation embeddings get no help from a graph), or a GEARS ``.pkl`` / ``.csv`` path."""
    if choice == "known":
        key = next((k for k in KNOWN_GRAPH_KEYS if k in adata.varp), None)
        if key is None:
            raise CapeInputError("--go-graph known needs varp['true_dag'] or varp['true_graph'] in the data; "
                                 "choose cape_dag, empty or a GO file")
        return adata.varp[key], f"known graph varp[{key}]"
    if choice == "cape_dag":
        if cape_positions is None or "cape_dag" not in cape_positions.varp:
            raise CapeInputError("--go-graph cape_dag needs Step I's DAG: include the 'cape' arm")
        if list(cape_positions.var_names) != list(adata.var_names):
            raise CapeInputError("Step I's DAG and the perturbation data have different genes")
        return sp.csr_matrix(cape_positions.varp["cape_dag"]), "Step I DAG (cape_dag)"
    if choice == "empty":
        return sp.csr_matrix((adata.n_vars, adata.n_vars)), "empty graph (self-loops only)"
    path = Path(str(choice))
    if path.suffix not in (".pkl", ".csv"):
        raise CapeInputError(f"--go-graph must be known, cape_dag, empty or a .pkl/.csv GO file, got {choice!r}")
    return path, f"GO file {path.name}"


def run_gears_benchmark(adata: ad.AnnData, *, dataset: str = "data", arms: Sequence[str] = DEFAULT_ARMS,
                        seeds: Sequence[int] = (0, 1), quick: bool = False, epochs: int | None = None,
                        go_graph="known", trainable_embeddings: bool = False, positions_seed: int = 0,
                        out: str | Path | None = "results/bench", name: str | None = None, threads: int | None = 1,
                        device: str | None = "auto", settings_overrides: Mapping | None = None) -> dict:
    """Each arm × seed through :func:`run_gears` on the same data, GO graph and split; the simple baselines (no
    change, training mean, additive, linear) in the same run. Writes ``<out>/<name>.{json,md,png}`` (``name`` =
    ``gears_<dataset>``).

    CAPE's positions come from :func:`cape_benchmarks.encodings.position_sets` on the control cells (the same
    Steps I–III settings as ``cape-bench encodings``, quick or full, changed by ``settings_overrides``, e.g.
    ``causal_tau``), once, shared by every seed. Returns ``{"records", "seconds", "cpu_seconds", "paths"}``.
    """

    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise CapeInputError(f"unknown arm(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(ARMS)}")
    if not seeds:
        raise CapeInputError("at least one seed is needed")
    _import_gears()
    epochs = epochs or (5 if quick else 20)
    settings = BenchSettings.for_mode(quick, **dict(settings_overrides or {}))
    start, cpu_start = time.perf_counter(), time.process_time()
    data = prepare_expression(adata, settings.n_genes)
    task = PerturbationTask.build(data)
    base = {"task": "perturbation", "dataset": dataset}
    records: list[dict] = []
    for predictor in simple_baselines():
        predicted, _, scores = task.evaluate(predictor)
        scores["mse_overall_excl_targets"] = mse_excluding_targets(predicted, task)
        records += [{**base, "kind": "baseline", "arm": predictor.name, "seed": None, "metric": m, "value": v}
                    for m, v in scores.items()]
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        positions = None
        dim = settings.embed_dim
        if "cape" in arms or go_graph == "cape_dag":
            sets, timings = position_sets(task.control_cells, ["cape"], settings, seed=positions_seed, device=device)
            positions = sets["cape"]
            records += [{**base, "kind": "positions", "arm": "cape", "seed": positions_seed, **t} for t in timings]
        graph, graph_note = resolve_go_graph(go_graph, data, positions)
        fixed = {}
        if "cape" in arms:
            fixed["cape"] = pd.DataFrame(positions.varm["cape_poincare"], index=positions.var_names
                                         ).reindex(data.var_names).fillna(0.0).to_numpy()
        if "pca" in arms:
            fixed["pca"] = pca_gene_embeddings(data, n_comps=dim)
        if "cape_oracle" in arms:
            fixed["cape_oracle"] = _oracle_positions(data, task.control_cells, settings, positions_seed, device)
        go_note = None
        for arm in arms:
            for seed in seeds:
                emb = (None if arm == "plain" else random_gene_embeddings(data.n_vars, dim, seed=seed)
                       if arm == "random" else fixed[arm])
                res = run_gears(data, emb, go_graph=graph, epochs=epochs, trainable_embeddings=trainable_embeddings,
                                device=device, seed=seed, num_threads=None)
                go_note = res["go_graph"]
                if not res["split_matches_cape"]:
                    logger.warning("GEARS' split differs from cape's simulation_split reimplementation")
                logger.info("GEARS %s seed %d: %s (%.1f s)", arm, seed,
                            ", ".join(f"{k} {v:.4f}" for k, v in res["metrics"].items()), res["seconds"])
                records += [{**base, "kind": "gears", "arm": arm, "seed": seed, "metric": m, "value": v,
                             "epochs": epochs, "trainable_embeddings": trainable_embeddings,
                             "embedding_dim": None if emb is None else int(emb.shape[1]), "go_graph": graph_note,
                             "seconds": res["seconds"], "best_val_top20_de_mse": res["best_val_top20_de_mse"],
                             "split_matches_cape": res["split_matches_cape"]}
                            for m, v in res["metrics"].items()]
    finally:
        torch.set_num_threads(previous)
    seconds = time.perf_counter() - start
    result = {"records": records, "seconds": seconds, "cpu_seconds": time.process_time() - cpu_start, "paths": {}}
    if out is not None:

        stem = Path(out) / (name or f"gears_{dataset}")
        stem.parent.mkdir(parents=True, exist_ok=True)
        info = {"n_cells": data.n_obs, "n_genes": data.n_vars, "seeds": list(seeds), "quick": quick, "epochs": epochs,
                "threads": threads, "cpu_count": len(os.sched_getaffinity(0)), "machine": platform.machine(),
                "load_average": os.getloadavg()[0], "go_graph": f"{graph_note} — {go_note}", "embed_dim": dim,
                "trainable_embeddings": trainable_embeddings, "split": task.split, "settings": settings}
        result["paths"] = {"json": write_json(records, stem.with_suffix(".json")),
                           "md": write_text(gears_markdown(result, dataset, info), stem.with_suffix(".md")),
                           "png": plot_gears(records, dataset, stem.with_suffix(".png"))}
    return result


def _oracle_positions(data: ad.AnnData, control: ad.AnnData, settings, seed: int, device) -> np.ndarray:
    """Poincaré positions of Steps II–III on the data's known DAG (``varp["true_dag"]`` / ``["true_graph"]``)."""

    key = next((k for k in KNOWN_GRAPH_KEYS if k in data.varp), None)
    if key is None:
        raise CapeInputError("arm cape_oracle needs the data's known graph in varp['true_dag'] or varp['true_graph']")
    pos = control.copy()
    tl.hyperbolic_embedding(pos, adjacency=sp.csr_matrix(data.varp[key]), geometry="hyperbolic", optimizer="rsgd",
                            dim=settings.embed_dim, epochs=settings.embed_epochs, device=device or "auto", seed=seed)
    return np.asarray(pos.varm["cape_poincare"], dtype=np.float64)


def gears_table(records: Sequence[dict], metrics: Sequence[str] = METRICS, digits: int = 3) -> str:
    """Markdown: one row per arm (and baseline), ``mean ± sd`` over seeds and, for GEARS arms, the difference to
    plain GEARS (lower MSE is better)."""
    frame = pd.DataFrame([r for r in records if r.get("kind") in ("gears", "baseline")])
    frame["value"] = frame["value"].astype(float)
    stats = frame.groupby(["kind", "arm", "metric"], sort=False)["value"].agg(["mean", "std", "count"])
    measured = [m for m in metrics if stats.xs(m, level="metric")["mean"].notna().any()]
    plain = stats.loc[("gears", "plain")]["mean"] if ("gears", "plain") in stats.index.droplevel(2) else None
    lines = ["| model | " + " | ".join(measured) + " |", "|---|" + "---|" * len(measured)]
    for kind, arm in dict.fromkeys(zip(frame["kind"], frame["arm"], strict=True)):
        cells = []
        for m in measured:
            if (kind, arm, m) not in stats.index or pd.isna(stats.loc[(kind, arm, m), "mean"]):
                cells.append("–")
                continue
            mean, sd, n = stats.loc[(kind, arm, m), ["mean", "std", "count"]]
            cell = f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if n > 1 and not pd.isna(sd) else "")
            if kind == "gears" and arm != "plain" and plain is not None and m in plain.index:
                cell += f" ({mean - plain[m]:+.{digits}f})"
            cells.append(cell)
        label = f"GEARS + {arm}" if kind == "gears" and arm != "plain" else ("GEARS" if kind == "gears" else arm)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gears_markdown(result: dict, dataset: str, info: dict) -> str:
    records = result["records"]
    arms = list(dict.fromkeys(r["arm"] for r in records if r.get("kind") == "gears"))
    split = info["split"]
    sizes = ", ".join(f"{g} {len(c)}" for g, c in split.test_by_subgroup().items())
    pos = [r for r in records if r.get("kind") == "positions"]
    parts = [f"# GEARS with CAPE gene embeddings: perturbation prediction on {dataset}", "",
             f"Top-20-DE MSE (lower is better), mean ± sd over seeds {', '.join(map(str, info['seeds']))}; in "
             "parentheses the difference to plain GEARS. Same data, split, GO graph and GEARS settings in every "
             "row; the metric is cape's (`cape-bench encodings --task perturbation`).", "",
             gears_table(records), "",
             "Rows: " + "; ".join(f"{'GEARS' if a == 'plain' else 'GEARS + ' + a}: {ARM_NOTES[a]}" for a in arms)
             + f". Embeddings {'fine-tuned by GEARS' if info['trainable_embeddings'] else 'frozen'}, width "
             f"{info['embed_dim']} zero-padded to GEARS' 64 and scaled into its unit ball; they initialise "
             "`gene_emb` and `pert_emb`. no_change / train_mean / additive / linear: cape's baselines on the same "
             "split.", "",
             f"GO graph: {info['go_graph']}.", "",
             f"Split: GEARS' simulation split, seed 1 (identical to cape's reimplementation: "
             f"{all(r.get('split_matches_cape', True) for r in records if r.get('kind') == 'gears')}); "
             f"{len(split.train)} train, {len(split.val)} validation, {len(split.test)} test perturbations ({sizes}).",
             ""]
    if pos:
        s = info["settings"]
        parts += [f"CAPE positions (once, seed {pos[0]['seed']}; Step I {s.causal_epochs} epochs, rank "
                  f"{s.causal_rank}, τ {s.causal_tau}; Step II d {s.embed_dim}, {s.embed_epochs} epochs): " + "; ".join(
            f"{r['step']} {r['metric']} = " + (f"{r['value']:.1f}" if r["metric"] == "seconds"
                                               else f"{int(r['value'])}") for r in pos) + ".", ""]
        if any(r["metric"] == "n_edges" and r["value"] == 0 for r in pos):
            parts += ["**Step I kept no edge: every CAPE position is the origin, so GEARS + cape got all-zero "
                      "embeddings in this run (lower the threshold with --causal-tau).**", ""]
    parts += [f"Data: {info['n_cells']} cells × {info['n_genes']} genes. GEARS {info['epochs']} epochs "
              f"(best validation epoch kept). Wall time {result['seconds'] / 60:.1f} min (CPU time "
              f"{result['cpu_seconds'] / 60:.1f} min) on {info['cpu_count']} CPU core(s) ({info['machine']}, "
              f"{info['threads']} torch thread(s), 1-min load average at the end {info['load_average']:.1f})"
              + (" — quick mode." if info["quick"] else "."), ""]
    return "\n".join(parts)


def plot_gears(records: Sequence[dict], dataset: str, path: str | Path) -> Path:
    """Bars per arm (mean ± sd over seeds) for overall / single / double MSE and the overall MSE without the
    perturbed genes themselves; baselines as dashed lines."""

    matplotlib.use("Agg")

    frame = pd.DataFrame([r for r in records if r.get("kind") in ("gears", "baseline")])
    frame["value"] = frame["value"].astype(float)
    shown = ("mse_overall", "mse_single", "mse_double", "mse_overall_excl_targets")
    metrics = [m for m in shown if frame.loc[frame["metric"] == m, "value"].notna().any()]
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.4 * len(metrics), 3.4), squeeze=False)
    gears_rows = frame[frame["kind"] == "gears"]
    arms = list(dict.fromkeys(gears_rows["arm"]))
    colors = {"plain": "tab:gray", "cape": "tab:red", "pca": "tab:blue", "random": "tab:olive",
              "cape_oracle": "tab:pink"}
    for ax, m in zip(axes[0], metrics, strict=True):
        stats = gears_rows[gears_rows["metric"] == m].groupby("arm", sort=False)["value"].agg(["mean", "std"])
        stats = stats.reindex(arms)
        ax.bar(range(len(arms)), stats["mean"], yerr=stats["std"].fillna(0), capsize=3,
               color=[colors.get(a, "tab:purple") for a in arms])
        for k, (arm, sub) in enumerate(frame[(frame["kind"] == "baseline") & (frame["metric"] == m)]
                                       .groupby("arm", sort=False)):
            ax.axhline(sub["value"].mean(), ls="--", lw=1, color=("black", "tab:green")[k % 2], label=arm)
        ax.set_xticks(range(len(arms)), ["GEARS" if a == "plain" else f"+{a}" for a in arms], rotation=30)
        ax.set_ylabel(f"{m} (↓)")
        ax.set_title(m, fontsize=9)
    axes[0][0].legend(fontsize=7, frameon=False, loc="lower left")
    fig.suptitle(f"GEARS on {dataset}: plain vs fed gene embeddings (top-20-DE MSE; dashed = baselines)",
                 fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return Path(path)
