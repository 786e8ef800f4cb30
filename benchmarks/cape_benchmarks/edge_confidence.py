"""``cape-bench edge-confidence``: does Step I's edge confidence tell its right edges from its wrong ones?

Data: negative-binomial counts from a simulation written apart from Step I's code and its simulators: a random DAG
whose edges act through a saturating function (x / (x + median x)), 1, 3 or 8 cell types that switch on five
"programme" genes each (the types' only difference), log-normal library sizes around 2,000 UMIs, NB dispersion 3,
then cape's preprocessing (normalise, log1p, every gene kept). Step I runs with its defaults
(:func:`cape.causal.learn_causal_graph`, which also computes :func:`cape.causal.edge_confidence`).

Per graph, among the kept edges (an edge is right when its pair is linked either way in the truth): the kept
edges' precision (what a random ranking's AUPRC comes to), the AUPRC of the confidence (as stored, and with its ties
broken by the partial correlation's size: :func:`cape.causal.edge_order`) and of Step I's own |weight|,
the share of the gap from the precision to 1 each closes, the precision of the edges called solid and of those
called guesses, and the skeleton F1 of the graph as kept and of its solid edges alone (a graph without its guesses).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import anndata as ad
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import scipy.sparse as sp

from cape._io import save_figure, write_json, write_text
from cape._tables import markdown_table
from cape.causal import SOLID_CONFIDENCE, CausalConfig, learn_causal_graph
from cape.pp import preprocess

from .causal import kept_edge_scores

__all__ = ["run_edge_confidence", "simulate_mixture_counts"]

logger = logging.getLogger("cape")

#: Cell-type counts of the panel: one population, and two mixtures.
TYPES = (1, 3, 8)
FULL = {"n_cells": 3000, "n_genes": 120, "n_edges": 180, "epochs": 100}
QUICK = {"n_cells": 400, "n_genes": 24, "n_edges": 30, "epochs": 10}


def simulate_mixture_counts(seed: int, n_cells: int = 3000, n_genes: int = 120, n_edges: int = 180,
                            n_types: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Log-normalised cells × genes and the true weighted DAG (rows: causes) of the module's simulation."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(n_genes)
    W = np.zeros((n_genes, n_genes))
    pairs: set[tuple[int, int]] = set()
    while len(pairs) < n_edges:
        i, j = sorted(rng.choice(n_genes, 2, replace=False))
        pairs.add((order[i], order[j]))
    for i, j in pairs:
        W[i, j] = rng.choice([-1, 1]) * rng.uniform(0.8, 2.0)
    types = rng.integers(0, n_types, n_cells)
    programmes = rng.choice(n_genes, 5 * n_types, replace=False).reshape(n_types, 5)
    basal = rng.uniform(0.5, 2.0, n_genes)
    x = np.zeros((n_cells, n_genes))
    for j in order:  # topological: a gene's causes are drawn before it
        drive = np.log(basal[j]) * np.ones(n_cells)
        for i in np.flatnonzero(W[:, j]):
            drive += W[i, j] * (x[:, i] / (x[:, i] + np.median(x[:, i]) + 1e-9) - 0.5)
        for t in range(n_types):
            if j in programmes[t]:
                drive[types == t] += 1.5
        x[:, j] = np.exp(drive + 0.3 * rng.normal(size=n_cells))
    depth = rng.lognormal(np.log(2000), 0.5, n_cells)
    mu = x / x.sum(1, keepdims=True) * depth[:, None]
    counts = rng.negative_binomial(3.0, 3.0 / (3.0 + mu))
    cells = ad.AnnData(counts.astype(np.float32))
    preprocess(cells, min_genes=1, n_top_genes=n_genes)
    X = cells.X.toarray() if sp.issparse(cells.X) else np.asarray(cells.X)
    keep = np.flatnonzero(X.std(0) > 0)
    return X[:, keep].astype(np.float64), W[np.ix_(keep, keep)]


def _scores(truth: np.ndarray, dag: np.ndarray, confidence: np.ndarray,
            partial_correlation: np.ndarray | None = None,
            pair_partial_correlation: np.ndarray | None = None) -> dict[str, float]:
    rows, cols = np.nonzero(dag)
    right = ((truth != 0) | (truth != 0).T)[rows, cols]
    out = {"kept": float(rows.size), "true_edges": float(np.count_nonzero(truth)), "kept_precision": float("nan"),
           **kept_edge_scores(truth, dag, confidence, partial_correlation, pair_partial_correlation)}
    by_weight = kept_edge_scores(truth, dag, np.abs(dag))
    out |= {f"weight_{k}": by_weight[f"confidence_{k}"] for k in ("auprc", "gap_closed")
            if f"confidence_{k}" in by_weight}
    solid = confidence[rows, cols] >= SOLID_CONFIDENCE
    out["solid"] = float(solid.sum())
    # the graph as kept, and without its guesses: would dropping them size the graph better on mixtures?
    n_true = np.count_nonzero(np.triu((truth != 0) | (truth != 0).T, 1))
    for name, chosen in (("skeleton_f1", np.ones_like(solid)), ("skeleton_f1_solid", solid)):
        hits = np.count_nonzero(right[chosen])
        out[name] = 2.0 * hits / (np.count_nonzero(chosen) + n_true) if n_true else float("nan")
    out["solid_precision"] = float(right[solid].mean()) if solid.any() else float("nan")
    out["guess_precision"] = float(right[~solid].mean()) if (~solid).any() else float("nan")
    return out


def run_edge_confidence(out: str | Path = "results/bench", quick: bool = False, seeds: int | None = None,
                        seed_offset: int = 0, types: tuple[int, ...] = TYPES) -> list[dict]:
    """Run the panel; write ``edge_confidence.json``/``.md``/``.png`` under ``out``; returns the records."""
    design = QUICK if quick else FULL
    seeds = seeds or (1 if quick else 5)
    records = []
    for n_types in types:
        for seed in range(seed_offset, seed_offset + seeds):
            X, truth = simulate_mixture_counts(seed, design["n_cells"], design["n_genes"], design["n_edges"], n_types)
            genes = np.array([f"g{i}" for i in range(X.shape[1])])
            start = time.perf_counter()
            graph = learn_causal_graph(X.astype(np.float32), genes, CausalConfig(epochs=design["epochs"]),
                                       device="cpu", seed=seed)
            base = {"n_types": n_types, "seed": seed, "states": graph.record["edge_confidence"]["n_states"],
                    "seconds": time.perf_counter() - start}
            scores = _scores(truth, graph.dag, graph.confidence, graph.partial_correlation,
                             graph.pair_partial_correlation)
            records.extend({**base, "metric": k, "value": v} for k, v in scores.items())
            logger.info("edge confidence: %d type(s) seed %d: %s", n_types, seed,
                        ", ".join(f"{k} {v:.3g}" for k, v in scores.items()))
    out = Path(out)
    write_json(records, out / "edge_confidence.json")
    write_text(_report(records, quick), out / "edge_confidence.md")
    save_figure(_figure(records), out / "edge_confidence.png")
    return records


METRICS = ("kept", "kept_precision", "confidence_auprc", "confidence_gap_closed", "ordered_confidence_gap_closed",
           "weight_auprc", "weight_gap_closed", "solid", "solid_precision", "guess_precision", "skeleton_f1",
           "skeleton_f1_solid")


def _report(records: list[dict], quick: bool) -> str:
    frame = pd.DataFrame(records)
    wide = frame.pivot_table(index=["n_types", "seed"], columns="metric", values="value").reset_index()
    rows = []
    for n_types, group in wide.groupby("n_types"):
        states = frame[frame["n_types"] == n_types].groupby("seed")["states"].first()
        cells = [f"{group[m].median():.3g} ({group[m].min():.3g}–{group[m].max():.3g})" if m in group else "–"
                 for m in METRICS]
        rows.append([str(n_types), f"{int(states.median())}", str(len(group)), *cells])
    header = ["cell types", "states found (median)", "seeds", *METRICS]
    return ("# Edge confidence on mixtures of cell types" + (" (quick)" if quick else "") + "\n\n"
            "Median (min–max) over seeds. `*_gap_closed`: (AUPRC − kept precision) / (1 − kept precision); "
            f"solid: confidence ≥ {SOLID_CONFIDENCE:g}.\n\n" + markdown_table(header, rows) + "\n")


def _figure(records: list[dict]):
    frame = pd.DataFrame(records)
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, name in enumerate(("confidence_gap_closed", "weight_gap_closed")):
        part = frame[frame["metric"] == name]
        x = part["n_types"].map({t: i for i, t in enumerate(sorted(frame["n_types"].unique()))}) + (k - 0.5) * 0.25
        ax.scatter(x, part["value"], label=name.replace("_gap_closed", ""), alpha=0.8)
    ax.axhline(0.5, color="0.5", lw=0.8, ls="--")
    ax.axhline(0.0, color="0.7", lw=0.6)
    ax.set_xticks(range(frame["n_types"].nunique()), [str(t) for t in sorted(frame["n_types"].unique())])
    ax.set_xlabel("cell types in the simulation")
    ax.set_ylabel("share of the gap to AUPRC 1 closed")
    ax.set_title("ranking Step I's kept edges: confidence against |weight|", fontsize=9)
    ax.legend(frameon=False, fontsize=8)
    return fig
