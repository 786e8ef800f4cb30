"""Expected run time of a benchmark config (``configs/benchmarks/paper_*.yaml``) from measured per-step costs.

Costs are measured on this machine at the config's model size (d_model, layers, heads, batch) with short token
sequences and a few steps, fitted per batch as ``a + b·T + c·T²`` in the tokens per cell ``T`` (the T² term is
attention), and extrapolated to the config's ``max_len``. Steps I and II are measured at the config's number of
genes and Step II dimension over a few epochs (the difference of two epoch counts, so setup is left out); Step I
scales with the number of cells. :func:`expected_seconds` is the arithmetic; :func:`measure_costs` the timing.

Every model of a config is counted as one run of the recipe of :mod:`cape_benchmarks.encodings_models` with all
epochs (early stopping can only shorten it: the estimate is an upper bound), every cell at ``max_len`` tokens.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import anndata as ad
import numpy as np
import scipy.sparse as sp
import torch

from cape import tl
from cape.models import CellTransformer

from .encodings_models import BenchSettings, variants

#: Cells of the paper datasets, as their manifests describe them (perturbation: control cells, which the
#: encodings benchmark pretrains on; GEARS trains on every cell).
DATASET_CELLS = {
    "zheng68k": {"cells": 68_579, "source": "data_manifests/zheng68k.yaml (10x filtered matrix, labelled cells)"},
    "segerstolpe_pancreas": {"cells": 2_209, "source": "data_manifests/segerstolpe_pancreas.yaml (cells passing QC)"},
    "scope2_specht": {"cells": 1_490, "source": "CAPE paper Supp. D.2.3 (1,490 cells, 3,042 proteins)"},
    "norman2019": {"cells": 91_205, "control_cells": 7_353,
                   "source": "GEARS' Norman file (91,205 cells, 7,353 'ctrl'): approximate, not checked offline"},
}


@dataclass(frozen=True)
class TransformerCost:
    """Seconds per batch as ``a + b·T + c·T²`` (T tokens per cell) for training and forward-only steps."""

    train: tuple[float, float, float]
    forward: tuple[float, float, float]

    def seconds(self, kind: str, tokens: int) -> float:
        a, b, c = getattr(self, kind)
        return a + b * tokens + c * tokens**2


def fit_batch_seconds(tokens: Sequence[int], seconds: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares ``a + b·T + c·T²`` through measured (T, seconds) with non-negative coefficients (a cost
    cannot fall with T); exact for three points on such a curve."""
    from scipy.optimize import nnls

    t = np.asarray(tokens, dtype=float)
    design = np.stack([np.ones_like(t), t, t**2], axis=1)
    scale = design.max(axis=0)  # columns of very different size: solve on scaled columns
    coef, _ = nnls(design / scale, np.asarray(seconds, dtype=float))
    return tuple(float(v) for v in coef / scale)


def n_models(bench: Mapping) -> int:
    """Models a config trains: encodings × integrations × seeds × backbones."""
    return (len(bench["encodings"]) * len(bench.get("integrations", ("complement", "replace")))
            * len(bench.get("seeds", (0, 1, 2))) * len(bench.get("backbones", ("scgpt", "scbert"))))


def position_set_runs(encodings: Sequence[str]) -> tuple[int, int]:
    """(Step I runs, Step II runs) for the encodings' position sets: Step I once for the causal sets (``cape``,
    ``euclidean``), Step II once per set (``correlation`` too)."""
    sets = {v.positions for v in variants(encodings)}
    return int(bool({"cape", "euclidean"} & sets)), len(sets & {"cape", "euclidean", "correlation"})


def expected_seconds(bench: Mapping, cost: TransformerCost, step1_per_cell_epoch: float,
                     step2_per_epoch: float, cells: int, *, control_cells: int | None = None) -> dict[str, float]:
    """Seconds of one config on the measured machine, by part; ``bench`` is its ``benchmark`` section.

    Per model (B = batch, T = max_len, n = cells, ⌈·⌉ batches): pretraining ``E_p·⌈0.9·n_p/B⌉`` training
    batches (``n_p`` = control cells for perturbation, else all cells; 10 % held out for validation, whose
    ``⌈0.1·n_p/B⌉`` forward batches are added); annotation fine-tuning ``E_f·(⌈0.8·0.3·n/B⌉ training +
    ⌈0.2·0.3·n/B⌉ forward)`` batches and ``⌈0.7·n/B⌉`` forward batches for the test cells; clustering and
    perturbation one forward pass over ``n_p``. Steps I–III: Step I ``E_I·n_p`` cell-epochs, Step II ``E_II``
    epochs per position set. The perturbation predictor, k-means and the baselines are not counted.
    """
    task = bench["task"]
    s = BenchSettings(**{k: bench[k] for k in ("n_genes", "d_model", "n_layers", "n_heads", "max_len", "batch_size",
                                                "lr", "pretrain_epochs", "annotation_pretrain_epochs",
                                                "fine_tune_epochs", "causal_epochs", "embed_epochs")
                         if bench.get(k) is not None})
    batch, tokens = s.batch_size, s.max_len
    train, forward = cost.seconds("train", tokens), cost.seconds("forward", tokens)

    def batches(n: float) -> int:
        return math.ceil(n / batch) if n > 0 else 0

    pre_cells = control_cells if task == "perturbation" else cells
    epochs = s.annotation_pretrain_epochs if task == "annotation" else s.pretrain_epochs
    model = {"pretraining": epochs * (batches(0.9 * pre_cells) * train + batches(0.1 * pre_cells) * forward)}
    if task == "annotation":
        tune = 0.3 * cells
        model["fine_tuning"] = s.fine_tune_epochs * (batches(0.8 * tune) * train + batches(0.2 * tune) * forward)
        model["inference"] = batches(0.7 * cells) * forward
    else:
        model["inference"] = batches(pre_cells) * forward
    models = n_models(bench)
    runs_1, runs_2 = position_set_runs(bench["encodings"])
    out = {f"{k}_per_model": v for k, v in model.items()}
    out |= {"models": models, "transformer": models * sum(model.values()),
            "step_I": runs_1 * s.causal_epochs * pre_cells * step1_per_cell_epoch,
            "step_II": runs_2 * s.embed_epochs * step2_per_epoch}
    out["total"] = out["transformer"] + out["step_I"] + out["step_II"]
    return out


# ------------------------------------------------------------------------------------------------ measuring
def _cells(n_cells: int, n_genes: int, seed: int = 0) -> ad.AnnData:
    """Dense positive log-expression (every gene expressed, so each cell has ``n_genes`` tokens)."""
    rng = np.random.default_rng(seed)
    adata = ad.AnnData(np.log1p(rng.poisson(3.0, size=(n_cells, n_genes)) + 1.0).astype(np.float32))
    adata.obs_names = [f"c{i}" for i in range(n_cells)]
    adata.var_names = [f"g{j}" for j in range(n_genes)]
    adata.var["cape_used"] = True
    return adata


def measure_transformer(backbone: str, d_model: int, n_layers: int, n_heads: int, batch_size: int,
                        tokens: Sequence[int] = (32, 64, 128), steps: int = 4, repeats: int = 2, seed: int = 0
                        ) -> dict[str, object]:
    """Seconds per training batch (masked-value pretraining) and per forward batch (embedding) at each token
    count, the fastest of ``repeats`` timings (the least disturbed by other load), with encoding ``none`` (the
    encodings' own cost is left out); and the fitted :class:`TransformerCost`."""
    rows = []
    for i, t in enumerate([tokens[0], *tokens]):  # the first, repeated, warms up (allocations, kernels)
        data = _cells(steps * batch_size, t - 1, seed)
        model = CellTransformer(data, backbone, "none", d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                                max_len=t, seed=seed, device="cpu")
        train, forward = math.inf, math.inf
        for _ in range(repeats if i else 1):
            start = time.perf_counter()
            model.pretrain(data, epochs=1, batch_size=batch_size, validation_fraction=0.0,
                           early_stopping_patience=None)
            train = min(train, (time.perf_counter() - start) / steps)
            start = time.perf_counter()
            model.embed(data, batch_size=batch_size, gene_key=None)
            forward = min(forward, (time.perf_counter() - start) / steps)
        if i:
            rows.append({"tokens": int(t), "train_seconds_per_batch": train, "forward_seconds_per_batch": forward})
    cost = TransformerCost(fit_batch_seconds(tokens, [r["train_seconds_per_batch"] for r in rows]),
                           fit_batch_seconds(tokens, [r["forward_seconds_per_batch"] for r in rows]))
    return {"rows": rows, "cost": cost}


def measure_positions(n_genes: int, embed_dim: int, cells: int = 256, epochs_I: int = 3,
                      epochs_II: tuple[int, int] = (2, 12), seed: int = 0) -> dict[str, float]:
    """Step I seconds per cell-epoch (rank 40, batch 128: the median of its recorded epoch times after the first)
    and Step II seconds per epoch (``embed_dim``, a random DAG with 2 edges per gene, negatives 'auto', from the
    time difference of two epoch counts, so that setup is left out)."""
    data = _cells(cells, n_genes, seed)
    fit = tl.causal_graph(data, rank=40, tau=0.2, epochs=epochs_I, device="cpu", seed=seed, use_genes=None,
                          copy=True)
    seconds = np.asarray(fit.uns["cape"]["causal_graph"]["history"]["seconds"], dtype=float)
    step1 = float(np.median(seconds[1:] if seconds.size > 1 else seconds)) / cells
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n_genes - 1, size=2 * n_genes)
    dst = src + 1 + (rng.random(2 * n_genes) * (n_genes - 1 - src)).astype(int)  # i < j: acyclic
    dag = sp.csr_matrix((np.ones(src.size), (src, dst)), shape=(n_genes, n_genes))
    dag.data[:] = 1.0
    times = []
    for e in epochs_II:
        start = time.perf_counter()
        tl.hyperbolic_embedding(data, dim=embed_dim, epochs=e, adjacency=dag, device="cpu", seed=seed, copy=True)
        times.append(time.perf_counter() - start)
    step2 = max(times[1] - times[0], 0.0) / (epochs_II[1] - epochs_II[0])
    return {"step_I_seconds_per_cell_epoch": step1, "step_II_seconds_per_epoch": step2}


def machine_note() -> dict[str, object]:
    """Threads and load average, recorded beside every measurement."""
    return {"torch_threads": torch.get_num_threads(), "cpu_count": len(os.sched_getaffinity(0)),
            "load_average_1min": os.getloadavg()[0]}


# ------------------------------------------------------------------------------------------------ configs
def _resolved(bench: Mapping) -> dict:
    """A config's ``benchmark`` section with the full preset filled in where it leaves options null."""
    preset = BenchSettings.for_mode(False)
    out = {k: getattr(preset, k) for k in ("n_genes", "d_model", "n_layers", "n_heads", "max_len", "batch_size",
                                           "pretrain_epochs", "annotation_pretrain_epochs", "fine_tune_epochs",
                                           "causal_epochs", "embed_epochs")}
    out |= {k: v for k, v in bench.items() if v is not None}
    out.setdefault("embed_dim", out["d_model"] // 2)
    if out["task"] != "gears":
        out.setdefault("encodings", [v.name for v in variants(None)])
    return out


def estimate_configs(configs: Mapping[str, Mapping], *, tokens: Sequence[int] = (128, 512, 1200),
                     steps: int = 2, repeats: int = 2, cells: int = 256) -> dict[str, object]:
    """Measure each distinct model size and (genes, Step II dimension) of ``configs`` (name → parsed YAML) once,
    and return ``{"measurements": [...], "estimates": {name: parts in seconds}, "machine": ...}``.

    A ``gears`` config is estimated for its Steps I–III only (GEARS' own training is not measured here).
    """
    machine = machine_note()
    transformer: dict[tuple, dict] = {}
    positions: dict[tuple, dict] = {}
    estimates: dict[str, dict] = {}
    for name, config in configs.items():
        bench = _resolved(config["benchmark"])
        size = (bench.get("backbones", ["scgpt"])[0], bench["d_model"], bench["n_layers"], bench["n_heads"],
                bench["batch_size"])
        genes = (bench["n_genes"], bench["embed_dim"])
        if genes not in positions:
            positions[genes] = measure_positions(*genes, cells=cells)
        step = positions[genes]
        sizes = DATASET_CELLS[bench["dataset"]]
        if bench["task"] == "gears":
            control = sizes.get("control_cells", sizes["cells"])
            estimates[name] = {"step_I": bench["causal_epochs"] * control * step["step_I_seconds_per_cell_epoch"],
                               "step_II": bench["embed_epochs"] * step["step_II_seconds_per_epoch"],
                               "gears": float("nan")}
            estimates[name]["total"] = estimates[name]["step_I"] + estimates[name]["step_II"]
            continue
        if size not in transformer:
            transformer[size] = measure_transformer(*size, tokens=tokens, steps=steps, repeats=repeats)
        estimates[name] = expected_seconds(bench, transformer[size]["cost"], step["step_I_seconds_per_cell_epoch"],
                                           step["step_II_seconds_per_epoch"], sizes["cells"],
                                           control_cells=sizes.get("control_cells"))
    measurements = [{"kind": "transformer", "backbone": k[0], "d_model": k[1], "n_layers": k[2], "n_heads": k[3],
                     "batch_size": k[4], "rows": v["rows"], "train_fit": v["cost"].train,
                     "forward_fit": v["cost"].forward} for k, v in transformer.items()]
    measurements += [{"kind": "positions", "n_genes": k[0], "embed_dim": k[1], "cells": cells, **v}
                     for k, v in positions.items()]
    machine["load_average_1min_end"] = os.getloadavg()[0]
    return {"measurements": measurements, "estimates": estimates, "machine": machine,
            "dataset_cells": DATASET_CELLS}


def runtime_markdown(result: Mapping) -> str:
    """The estimates as a table (hours) with the measured inputs below it."""
    m = result["machine"]
    lines = ["# Expected run time of the paper-scale configs (estimates)", "",
             f"Extrapolated from CPU measurements on this machine ({m['torch_threads']} torch thread, "
             f"{m['cpu_count']} cores, load average {m['load_average_1min']:.2f} → {m['load_average_1min_end']:.2f}):"
             " upper bounds (every epoch run, every cell at max_len tokens). GPU times are not measured.", "",
             "| config | models | transformer (CPU h) | Step I (CPU h) | Step II (CPU h) | total (CPU h) |",
             "|---|---|---|---|---|---|"]
    for name, e in result["estimates"].items():
        models = e.get("models", "GEARS not counted")
        lines.append(f"| {name} | {models} | {e.get('transformer', float('nan')) / 3600:.4g} | "
                     f"{e['step_I'] / 3600:.3g} | {e['step_II'] / 3600:.3g} | {e['total'] / 3600:.4g} |")
    lines += ["", "Measured inputs:", ""]
    for r in result["measurements"]:
        if r["kind"] == "transformer":
            rows = ", ".join(f"T={x['tokens']}: {x['train_seconds_per_batch']:.3f} s train / "
                             f"{x['forward_seconds_per_batch']:.3f} s forward" for x in r["rows"])
            lines.append(f"- {r['backbone']} d_model {r['d_model']}, {r['n_layers']} layers, {r['n_heads']} heads, "
                         f"batch {r['batch_size']}: {rows} per batch")
        else:
            lines.append(f"- {r['n_genes']} genes: Step I {r['step_I_seconds_per_cell_epoch'] * 1e3:.3f} ms per "
                         f"cell-epoch (rank 40, {r['cells']} cells); Step II (d {r['embed_dim']}) "
                         f"{r['step_II_seconds_per_epoch']:.3f} s per epoch")
    return "\n".join(lines) + "\n"
