"""``cape-bench causal-scale``: cost of Step I against cells N and genes M (paper Fig. S5).

Three sweeps, on CPU and, when present, on CUDA:

* ``N``: seconds per training epoch for N = 1e4 … 1e5 cells at M = 100 genes (low rank r = 40, and dense);
* ``M``: seconds per epoch for M = 100 … 2,000 genes at N = 1e4 (low rank r = 40, and dense A with the
  exact M×M acyclicity while M ≤ 1,000: beyond that one dense step takes seconds);
* ``h``: seconds for one value + gradient of h(UVᵀ), exact M×M exponential vs the k×k identity (k = 820),
  and for the linearised penalty the trainer uses between exact steps at this size (``h_every`` > 1): one
  evaluation with gradient (``linearised_step``) and one re-linearisation (``linearise``);
* ``fit``: wall time of one complete default fit (rank 40, 100 epochs, compiling included) at
  M = 2,000 genes × N = 10,000 cells.

Data are random Gaussian (timing does not depend on the values). An epoch is timed as one full pass of
:func:`cape.causal.fit_variational_notears` (``epochs=1``), including the per-epoch exact h evaluation.
Outputs ``causal_scale.json``/``.md``/``.png`` under ``out``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import torch

from cape._io import save_figure, write_json, write_text
from cape._tables import mean_sd_table
from cape.causal import LinearisedAcyclicity, acyclicity_dense, acyclicity_low_rank, fit_variational_notears
from cape.causal.trainer import AUTO_H_EVERY, AUTO_H_EVERY_LARGE, AUTO_H_EVERY_LARGE_M, EXACT_ACYCLICITY_MAX

__all__ = ["run_causal_scale"]

logger = logging.getLogger("cape")

FULL = {"N": [10_000, 30_000, 50_000, 70_000, 90_000], "M": [100, 300, 500, 700, 900, 1_000, 2_000],
        "dense_max_M": 1_000, "h_M": [100, 300, 500, 820, 1_000, 1_500, 2_000], "fit": [(10_000, 2_000)],
        "fit_epochs": 100}
QUICK = {"N": [2_000, 5_000, 10_000], "M": [50, 100, 200, 400], "dense_max_M": 400,
         "h_M": [100, 300, 820, 1_000], "fit": [(2_000, 200)], "fit_epochs": 20}


def _epoch_seconds(n_cells: int, n_genes: int, rank: int | None, device: str, seed: int = 0) -> float:
    X = np.random.default_rng(seed).normal(size=(n_cells, n_genes)).astype(np.float32)
    fit = fit_variational_notears(X, rank=rank, epochs=1, device=device, seed=seed,
                                  progress_desc=f"N={n_cells} M={n_genes}")
    return float(fit.history["seconds"][0])


def _fit_seconds(n_cells: int, n_genes: int, epochs: int, device: str, seed: int = 0) -> tuple[float, int]:
    """Wall time of a whole default fit (all epochs; early stopping off) and the h_every it used."""
    X = np.random.default_rng(seed).normal(size=(n_cells, n_genes)).astype(np.float32)
    start = time.perf_counter()
    fit = fit_variational_notears(X, rank=40, epochs=epochs, min_epochs=epochs, device=device,
                                  seed=seed, progress_desc=f"fit N={n_cells} M={n_genes}")
    return time.perf_counter() - start, fit.h_every


def _h_seconds(n_genes: int, method: str, device: str, rank: int = 40, repeats: int = 3) -> float:
    gen = torch.Generator().manual_seed(0)
    U = (torch.randn(n_genes, rank, generator=gen) * 0.05).to(device).requires_grad_()
    V = (torch.randn(n_genes, rank, generator=gen) * 0.05).to(device).requires_grad_()
    linearised = LinearisedAcyclicity(U @ V.T, U, V) if method == "linearised_step" else None
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        if method == "linearise":
            LinearisedAcyclicity(U @ V.T, U, V)
        else:
            h = {"exact": lambda: acyclicity_dense(U @ V.T), "low_rank": lambda: acyclicity_low_rank(U, V),
                 "linearised_step": lambda: linearised(U @ V.T)}[method]()
            h.backward()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def run_causal_scale(out: str | Path = "results/bench", quick: bool = False) -> list[dict]:
    """Run the sweeps on CPU (and CUDA when available); write ``causal_scale.*``; return the records."""

    grid = QUICK if quick else FULL
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    records: list[dict] = []

    def add(sweep, method, device, n_cells, n_genes, metric, value):
        records.append({"sweep": sweep, "method": method, "device": device, "n_cells": n_cells,
                        "n_genes": n_genes, "metric": metric, "value": value,
                        "threads": torch.get_num_threads()})
        logger.info("%s %s %s N=%s M=%s: %.3f s", sweep, method, device, n_cells, n_genes, value)

    for device in devices:
        for n in grid["N"]:
            for method, rank in (("low_rank", 40), ("dense", None)):
                add("N", method, device, n, 100, "seconds_per_epoch", _epoch_seconds(n, 100, rank, device))
        for m in grid["M"]:
            add("M", "low_rank", device, 10_000 if not quick else 2_000, m, "seconds_per_epoch",
                _epoch_seconds(10_000 if not quick else 2_000, m, 40 if m > 40 else None, device))
            if m <= grid["dense_max_M"]:
                add("M", "dense", device, 10_000 if not quick else 2_000, m, "seconds_per_epoch",
                    _epoch_seconds(10_000 if not quick else 2_000, m, None, device))
        for m in grid["h_M"]:
            for method in ("exact", "low_rank", "linearised_step", "linearise"):
                add("h", method, device, None, m, "seconds_h_and_grad", _h_seconds(m, method, device))
        for n, m in grid["fit"]:
            seconds, h_every = _fit_seconds(n, m, grid["fit_epochs"], device)
            add("fit", f"low_rank, {grid['fit_epochs']} epochs, h_every {h_every}", device, n, m,
                "seconds_fit", seconds)

    out = Path(out)
    write_json(records, out / "causal_scale.json")
    tables = []
    for sweep, key in (("N", "n_cells"), ("M", "n_genes"), ("h", "n_genes")):
        sub = [r for r in records if r["sweep"] == sweep]
        tables.append(f"## sweep {sweep}\n\n" + mean_sd_table(sub, rows=["device", key], columns=["method"]))
    tables.append("## one whole fit\n\n" + "\n".join(
        f"- {r['device']}: {r['n_genes']:,} genes × {r['n_cells']:,} cells, {r['method']}: {r['value']:.0f} s "
        f"({r['value'] / 60:.1f} min)" for r in records if r["sweep"] == "fit"))

    write_text(f"# Step I scaling{' (quick)' if quick else ''}\n\nseconds per epoch (N, M sweeps; batch 128; "
               f"default h_every: exact acyclicity every step while min(M, k) ≤ {EXACT_ACYCLICITY_MAX}, else "
               f"re-linearised every {AUTO_H_EVERY} steps, every {AUTO_H_EVERY_LARGE} beyond "
               f"{AUTO_H_EVERY_LARGE_M} genes) and per h evaluation with gradient (h sweep, "
               f"r = 40). torch threads: {torch.get_num_threads()}.\n\n"
               + "\n\n".join(tables) + "\n", out / "causal_scale.md")
    save_figure(_figure(records), out / "causal_scale.png")
    return records


def _figure(records: list[dict]):
    matplotlib.use("Agg")

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (sweep, key, ylabel) in zip(axes, [("N", "n_cells", "s / epoch"), ("M", "n_genes", "s / epoch"),
                                               ("h", "n_genes", "s per h + gradient")], strict=True):
        sub = [r for r in records if r["sweep"] == sweep]
        for (method, device) in sorted({(r["method"], r["device"]) for r in sub}):
            pts = sorted((r[key], r["value"]) for r in sub if r["method"] == method and r["device"] == device)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{method} ({device})")
        ax.set_xlabel("cells N (M = 100)" if sweep == "N" else "genes M")
        ax.set_ylabel(ylabel)
        if sweep != "N":
            ax.set_yscale("log")
        ax.set_title({"N": "epoch time vs N", "M": "epoch time vs M", "h": "acyclicity: exact, k×k, linearised"}[sweep])
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
