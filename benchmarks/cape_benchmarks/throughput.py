"""Throughput on the CPU and on CUDA side by side: Step I's seconds and its graph's F1, Step II's seconds, pretraining
and fine-tuning cells/s, the share of a profiled stretch in which the GPU is busy, and the model FLOPs utilisation
of the scGPT-sized model.

Data: ``simulate_grn_cells(**GRN_SIMULATIONS[design])`` (``"scale"``: 2,000 genes, 10,000 control cells; ``--quick``:
``"quick"``; ``--design transcriptome``: 10,000 genes, 50,000 control cells, Step I and Step II only, CUDA only unless
devices are named), ``cape.pp.preprocess(min_genes=20)`` with every gene kept as highly variable, control cells, genes
that vary. Every stage runs on each device asked for, one after the other in one process; each record names its device,
and on CUDA Step I's records carry the peak GPU memory. Run ``cape-bench throughput``.
"""

from __future__ import annotations

import functools
import json
import logging
import platform
import time
from collections.abc import Callable
from pathlib import Path

import anndata as ad
import numpy as np
import torch

import cape
from cape._errors import CapeInputError
from cape._settings import resolve_device
from cape.causal import CausalConfig, fit_variational_notears
from cape.causal import pipeline as step1
from cape.causal.structure_recovery import dag_metrics
from cape.data.grn_cells import GRN_SIMULATIONS, simulate_grn_cells
from cape.models import CellTransformer

from .causal import skeleton_f1

logger = logging.getLogger("cape")

#: The scGPT-sized backbone (scGPT's pretrained whole-human model: 512 wide, 12 layers, 8 heads).
SCGPT_SIZE = {"d_model": 512, "n_layers": 12, "n_heads": 8}
#: Dense bf16 peak of the card, for the FLOPs utilisation (NVIDIA's datasheets; H100 and H200 SXM share it).
PEAK_BF16_FLOPS = {"H100": 989.4e12, "H200": 989.4e12}
#: Epochs timed per pretraining run (the first also starts workers and plans kernels; the later ones are the rate).
EPOCHS = 3


def scale_cells(size: str = "scale", seed: int = 0) -> tuple[ad.AnnData, np.ndarray]:
    """The preprocessed control cells of the ``size`` design and their true DAG (genes that vary only)."""
    a = simulate_grn_cells(**{**GRN_SIMULATIONS[size], "seed": seed})
    # Every gene is highly variable here, so that Step I sees the design's genes (the default 300 would cut it).
    cape.pp.preprocess(a, min_genes=20, n_top_genes=a.n_vars)
    a = a[a.obs["condition"].astype(str) == "ctrl"].copy()
    X = a.X.toarray() if hasattr(a.X, "toarray") else np.asarray(a.X)
    a = a[:, X.std(0) > 0].copy()
    return a, a.varp["true_dag"].toarray()


def hardware(device: str) -> str:
    """The processor or GPU a record was measured on."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads"


def busy_share(fn: Callable[[], object]) -> tuple[float, float]:
    """Run ``fn`` under torch.profiler: (wall seconds, share of them in which a CUDA kernel or copy ran).

    Kernel intervals are merged before summing, so overlapping kernels are counted once.
    """
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    busy, end = 0.0, -np.inf
    for lo, hi in spans:
        if hi > end:
            busy += hi - max(lo, end)
            end = hi
    return wall, busy * 1e-6 / max(wall, 1e-9)


#: The designs ``cape-bench throughput`` runs on (keys of GRN_SIMULATIONS) and the stages each runs by default.
DESIGN_STAGES = {"quick": ("step1", "step2", "pretrain", "finetune", "scgpt"),
                 "scale": ("step1", "step2", "pretrain", "finetune", "scgpt"),
                 "transcriptome": ("step1", "step2")}


def step1_record(adata: ad.AnnData, truth: np.ndarray, device: str, seed: int) -> dict:
    """Step I's default fit (``cape.tl.causal_graph``): seconds, edges, directed and skeleton F1, and on CUDA the peak
    GPU memory (GB)."""
    b = adata.copy()
    _sync(device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(torch.device(device))
    start = time.perf_counter()
    cape.tl.causal_graph(b, device=device, seed=seed)
    _sync(device)
    seconds = time.perf_counter() - start
    A = b.varp["cape_dag"]
    A = np.asarray(A.toarray() if hasattr(A, "toarray") else A)
    metrics = dag_metrics(truth, A)
    peak = torch.cuda.max_memory_allocated(torch.device(device)) / 1e9 if device.startswith("cuda") else None
    return {"stage": "step1", "device": device, "seconds": seconds, "edges": int(np.count_nonzero(A)),
            "directed_f1": metrics["f1"], "skeleton_f1": skeleton_f1(truth, A), "gpu_peak_gb": peak, "adata": b}


def step1_loop_busy(adata: ad.AnnData, device: str, seed: int, epochs: int = 3) -> dict:
    """The GPU's busy share over ``epochs`` epochs of Step I's default training loop (screened candidates)."""
    config = CausalConfig()
    X, _, _ = step1.check_matrix(adata.X, np.asarray(adata.var_names))
    _, candidates, _ = step1.screen(config, X)
    options = {**config.notears_options(X.shape[1], screened=candidates is not None), "epochs": epochs}
    wall, share = busy_share(lambda: fit_variational_notears(X, device=device, seed=seed, candidates=candidates,
                                                             **options))
    return {"stage": "step1_loop", "device": device, "seconds": wall, "epochs": epochs, "gpu_busy": share}


def step1_fit_records(adata: ad.AnnData, device: str, seed: int) -> list[dict]:
    """Step I's default training loop on CUDA with its steps replayed as CUDA graphs (the default) and kernel by kernel
    (``cuda_graphs=False``), same seed: seconds, epochs, and as ``edges`` the weights of |A| ≥ 0.01 each ends with."""
    config = CausalConfig()
    X, _, _ = step1.check_matrix(adata.X, np.asarray(adata.var_names))
    _, candidates, _ = step1.screen(config, X)
    options = config.notears_options(X.shape[1], screened=candidates is not None)
    records = []
    for graphs in (True, False):
        _sync(device)
        start = time.perf_counter()
        fit = fit_variational_notears(X, device=device, seed=seed, candidates=candidates, cuda_graphs=graphs, **options)
        _sync(device)
        records.append({"stage": "step1_fit" if graphs else "step1_fit_eager", "device": device,
                        "seconds": time.perf_counter() - start, "epoch": fit.epochs_run,
                        "edges": int(np.count_nonzero(np.abs(fit.adjacency) >= 0.01)), "cuda_graphs": fit.cuda_graphs})
    return records


def step2_record(adata: ad.AnnData, device: str, seed: int) -> dict:
    """Step II (``cape.tl.hyperbolic_embedding``) on the Step I graph in ``adata``: seconds."""
    b = adata.copy()
    _sync(device)
    start = time.perf_counter()
    cape.tl.hyperbolic_embedding(b, device=device, seed=seed)
    _sync(device)
    return {"stage": "step2", "device": device, "seconds": time.perf_counter() - start}


def training_records(adata: ad.AnnData, device: str, seed: int, n_cells: int, size: str, batch_size: int,
                     finetune: bool = False, cuda_graphs: bool | None = None) -> list[dict]:
    """Cells/s per epoch of pretraining (or, with ``finetune``, of annotation training on ``cell_type``);
    ``cuda_graphs=False``: kernel by kernel (stage name ending in ``_eager``)."""
    options = SCGPT_SIZE if size == "scgpt" else {}
    cells = adata[:n_cells].copy()
    model = CellTransformer(cells, architecture="scgpt", encoding="cape", device=device, seed=seed, **options)
    if finetune:
        history = model.train(cells, "cell_type", epochs=EPOCHS, batch_size=batch_size, validation_fraction=0.0,
                              cuda_graphs=cuda_graphs)
    else:
        history = model.pretrain(cells, epochs=EPOCHS, batch_size=batch_size, validation_fraction=0.0,
                                 cuda_graphs=cuda_graphs)
    stage = (("finetune" if finetune else "pretrain") + ("_scgpt" if size == "scgpt" else "")
             + ("_eager" if cuda_graphs is False else ""))
    records = [{"stage": stage, "device": device, "batch_size": batch_size, "cells": n_cells, "epoch": h["epoch"],
                "cells_per_s": h["cells_per_s"], "seconds": h["seconds"]} for h in history]
    if device.startswith("cuda") and size == "scgpt" and not finetune:
        records[-1]["mfu"] = model_flops_utilisation(model, cells, device, batch_size, records[-1]["cells_per_s"])
    return records


def model_flops_utilisation(model: CellTransformer, cells: ad.AnnData, device: str, batch_size: int,
                            cells_per_s: float) -> float | None:
    """Achieved FLOP/s of pretraining (FLOPs of one forward and backward pass per cell, counted by torch's
    FlopCounterMode, times cells/s) over the card's dense bf16 peak; None for a card without a known peak."""
    from torch.utils.flop_counter import FlopCounterMode

    name = torch.cuda.get_device_name(torch.device(device))
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    if peak is None:
        return None
    batch = next(iter(model.batches(cells, batch_size=batch_size)))
    counter = FlopCounterMode(display=False)
    with counter, model._autocast():
        hidden = model.backbone(batch["gene_ids"], batch["values"], batch["padding_mask"])
        hidden.float().pow(2).mean().backward()
    model.module.zero_grad(set_to_none=True)
    per_cell = counter.get_total_flops() / batch["gene_ids"].shape[0]
    return per_cell * cells_per_s / peak


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _table(records: list[dict]) -> str:
    columns = ["stage", "device", "batch", "epoch", "seconds", "cells/s", "edges", "directed F1", "skeleton F1",
               "GPU busy", "MFU", "GPU peak GB"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]

    def cell(r, key, fmt):
        return fmt.format(r[key]) if r.get(key) is not None else ""

    for r in records:
        lines.append("| " + " | ".join([r["stage"], r["device"], cell(r, "batch_size", "{}"), cell(r, "epoch", "{}"),
                                        cell(r, "seconds", "{:.2f}"), cell(r, "cells_per_s", "{:,.0f}"),
                                        cell(r, "edges", "{:,}"), cell(r, "directed_f1", "{:.3f}"),
                                        cell(r, "skeleton_f1", "{:.3f}"), cell(r, "gpu_busy", "{:.0%}"),
                                        cell(r, "mfu", "{:.1%}"), cell(r, "gpu_peak_gb", "{:.1f}")]) + " |")
    return "\n".join(lines)


def _training_stages(ready: ad.AnnData, device: str, seed: int, n_cells: int, stages: list[str]) -> list[dict]:
    """Pretraining (batch 32, the default, and on CUDA 64 and 256, and 32 kernel by kernel), fine-tuning (batch 32), the
    scGPT-sized model (CUDA; batch 64 also kernel by kernel) and a profiled pretraining run (CUDA)."""
    cuda, records = device.startswith("cuda"), []
    for batch in (32, 64, 256) if cuda else (32,):
        if "pretrain" in stages:
            records += training_records(ready, device, seed, n_cells, "default", batch)
    if "pretrain" in stages and cuda:  # the default batch kernel by kernel, for comparison
        records += training_records(ready, device, seed, n_cells, "default", 32, cuda_graphs=False)
    if "finetune" in stages:
        records += training_records(ready, device, seed, n_cells, "default", 32, finetune=True)
    if "scgpt" in stages and cuda:
        for batch in (64, 256):
            records += training_records(ready, device, seed, n_cells, "scgpt", batch)
        records += training_records(ready, device, seed, n_cells, "scgpt", 64, cuda_graphs=False)
    if "pretrain" in stages and cuda:
        wall, share = busy_share(functools.partial(training_records, ready, device, seed, min(n_cells, 2000),
                                                   "default", 64))
        records.append({"stage": "pretrain_profiled", "device": device, "batch_size": 64, "seconds": wall,
                        "gpu_busy": share})
    return records


def throughput_devices(design: str, devices: list[str] | None) -> list[str]:
    """The devices asked for, else CPU and CUDA (where present); the whole-transcriptome design only on CUDA unless
    the CPU is named (on a CPU its Step I takes hours). A device that is not there is refused before any data are
    made."""
    if devices:
        for device in devices:
            resolve_device(device)  # one line for a CUDA device on a machine without one, or an unknown name
        return devices
    cuda = torch.cuda.is_available()
    if design == "transcriptome":
        if not cuda:
            raise CapeInputError("--design transcriptome runs on CUDA and no GPU is visible: name --devices cpu to run "
                                 "its Step I on the CPU anyway (hours)")
        return ["cuda"]
    return ["cpu", "cuda"] if cuda else ["cpu"]


def run_throughput(out: str | Path = "results/bench", *, devices: list[str] | None = None, quick: bool = False,
                   stages: list[str] | None = None, seed: int = 0, pretrain_cells: int = 4000,
                   design: str = "scale") -> list[dict]:
    """Every stage on every device; writes ``throughput.json`` and ``throughput.md`` under ``out``.

    ``design`` names the simulation (:data:`DESIGN_STAGES`); ``quick=True`` is the ``"quick"`` design."""
    design = "quick" if quick else design
    if design not in DESIGN_STAGES:
        raise CapeInputError(f"design must be one of {', '.join(DESIGN_STAGES)}, got {design!r}")
    devices = throughput_devices(design, devices)
    stages = stages or list(DESIGN_STAGES[design])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    adata, truth = scale_cells(design, seed)
    X = adata.X
    header = {"design": design, "cells": adata.n_obs, "genes": adata.n_vars, "true_edges": int(np.count_nonzero(truth)),
              "x_sum": float(X.sum()), "x_nnz": int(X.nnz if hasattr(X, "nnz") else np.count_nonzero(X)),
              "torch": torch.__version__, "hardware": {d: hardware(d) for d in devices}}
    print(json.dumps(header), flush=True)
    records: list[dict] = []

    def keep(new: list[dict]) -> None:
        for r in new:
            records.append({k: v for k, v in r.items() if k != "adata"})
            print(json.dumps(records[-1]), flush=True)
        (out / "throughput.json").write_text(json.dumps({"data": header, "records": records}, indent=1))
        (out / "throughput.md").write_text(_table(records) + "\n")

    n_cells = min(pretrain_cells, adata.n_obs)
    graph = None  # Step I's graph for the later stages: the first device's
    for device in devices:
        if "step1" in stages:
            rec = step1_record(adata, truth, device, seed)
            graph = graph if graph is not None else rec["adata"]
            keep([rec])
            if device.startswith("cuda"):
                keep([step1_loop_busy(adata, device, seed)])
                if design != "transcriptome":  # a second and third whole fit, kernel by kernel: too long at that size
                    keep(step1_fit_records(adata, device, seed))
    if graph is None:
        graph = adata.copy()
        cape.tl.causal_graph(graph, device=devices[0], seed=seed)
    ready = None
    if {"pretrain", "finetune", "scgpt"} & set(stages):
        ready = graph.copy()
        cape.tl.hyperbolic_embedding(ready, device=devices[0], seed=seed)
        cape.tl.rotary_encoding(ready)
    for device in devices:
        if "step2" in stages:
            keep([step2_record(graph, device, seed)])
        if ready is not None:
            keep(_training_stages(ready, device, seed, n_cells, stages))
    print(_table(records))
    return records
