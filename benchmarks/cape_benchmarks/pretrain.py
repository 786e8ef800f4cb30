"""``cape-bench pretrain``: masked-value pretraining throughput (cells/s) and loss curves per backbone × encoding.

Default data: scanpy's ``pbmc68k_reduced`` (700 cells × 765 genes, log-normalised; ``cape.data.load``), a small
CPU configuration (d_model 64, 2 layers, 4 heads, 256 tokens per cell). Encodings that need CAPE positions use
the AnnData's ``varm``/``varp`` keys when ``--input`` has them (``results/<dataset>/encoded.h5ad``); otherwise
they run on random stand-in positions and the records say so (``positions = "random stand-in"``): the throughput
is meaningful, the loss is not a CAPE result then.

Writes ``pretrain.json`` (records), ``pretrain.md`` (mean ± sd over seeds) and ``pretrain.png`` (loss curves and
cells/s) to the output folder.
"""

from __future__ import annotations

import logging
import os
import platform
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import torch

from cape import data, encodings
from cape._errors import CapeInputError
from cape._io import save_figure, write_json, write_text
from cape._tables import mean_sd_table
from cape.models import CellTransformer, GeneVocab, gene_positions, random_positions

logger = logging.getLogger("cape")

DEFAULT_ENCODINGS = ["none", "trainable_absolute", "rope", "cape"]


def _positions_for(adata, model_vocab_genes, encoding: str, seed: int):
    """Positions from the AnnData when it has what ``encoding`` needs, else random stand-ins."""

    vocab = GeneVocab.from_genes(model_vocab_genes)
    try:
        pos = gene_positions(adata, vocab, encoding)
        encodings.get(encoding, d_model=64, n_heads=4, n_layers=1, vocab_size=len(vocab), positions=pos)
        return pos, "anndata"
    except CapeInputError:
        return random_positions(vocab, dim=8, seed=seed), "random stand-in"


def run_benchmark(out: str | Path, *, quick: bool = False, input_path: str | None = None,
                  architectures: list[str] | None = None, encoding_names: list[str] | None = None,
                  epochs: int | None = None, seeds: list[int] | None = None, threads: int = 2,
                  d_model: int = 64, n_layers: int = 2, n_heads: int = 4, max_len: int = 256,
                  batch_size: int = 32) -> list[dict]:
    """Run the benchmark and write its JSON, markdown and PNG; returns the records."""

    out = Path(out)
    architectures = architectures or ["scgpt", "scbert"]
    encoding_names = encoding_names or (["none", "cape"] if quick else DEFAULT_ENCODINGS)
    unknown = [e for e in encoding_names if e not in encodings.available()]
    if unknown:
        raise CapeInputError(f"unknown encoding(s) {unknown}; available: {', '.join(encodings.available())}")
    epochs = epochs or (2 if quick else 10)
    seeds = seeds or [0]
    adata = data.read(input_path, expect_counts=False) if input_path else data.load("pbmc68k_reduced")
    dataset = Path(input_path).stem if input_path else "pbmc68k_reduced"
    if quick:
        adata = adata[:200].copy()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    records, curves = [], {}
    try:
        for arch in architectures:
            for enc in encoding_names:
                for seed in seeds:
                    positions, source = _positions_for(adata, adata.var_names, enc, seed)
                    if encodings.get_class(enc).requires is None:
                        positions, source = None, "none needed"
                    model = CellTransformer(adata, arch, enc, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                                            max_len=max_len, positions=positions, seed=seed, device="cpu")
                    history = model.pretrain(adata, epochs=epochs, batch_size=batch_size,
                                             validation_fraction=0.1, early_stopping_patience=None)
                    curves[(arch, enc, seed)] = history
                    # scBERT runs encodings with a logit term on exact softmax attention, not Performer
                    base = {"dataset": dataset, "architecture": arch, "encoding": enc, "positions": source,
                            "attention": model.backbone.attention_kind,
                            "seed": seed, "threads": threads, "epochs": epochs, "d_model": d_model,
                            "n_layers": n_layers, "n_heads": n_heads, "max_len": max_len,
                            "n_cells": adata.n_obs, "machine": platform.machine(),
                            "cpu_count": len(os.sched_getaffinity(0))}
                    # The first epoch includes warm-up; report the median of the others when there are any.
                    speeds = [h["cells_per_s"] for h in history[1:]] or [history[0]["cells_per_s"]]
                    values = {"cells_per_s": float(np.median(speeds)),
                              "train_loss_first": history[0]["train_loss"],
                              "train_loss_last": history[-1]["train_loss"],
                              "val_loss_first": history[0]["val_loss"], "val_loss_last": history[-1]["val_loss"]}
                    for metric, value in values.items():
                        records.append({**base, "metric": metric, "value": value})
                    logger.info("pretrain %s/%s seed %d: %.1f cells/s, loss %.4f → %.4f", arch, enc, seed,
                                values["cells_per_s"], values["train_loss_first"], values["train_loss_last"])
    finally:
        torch.set_num_threads(previous_threads)
    out.mkdir(parents=True, exist_ok=True)
    write_json(records, out / "pretrain.json")
    table = mean_sd_table(records, rows=["architecture", "encoding", "attention", "positions"], columns=["metric"])
    note = (f"Masked value pretraining on {dataset} ({adata.n_obs} cells × {adata.n_vars} genes), d_model "
            f"{d_model}, {n_layers} layers, {n_heads} heads, ≤{max_len} tokens/cell, batch {batch_size}, "
            f"{epochs} epochs, {threads} CPU thread(s); cells/s = median over epochs 2+. scGPT loss: MSE on bins "
            "scaled to [0, 1]; scBERT loss: cross-entropy over expression levels.\n\n")
    write_text(note + table + "\n", out / "pretrain.md")
    _plot(curves, records, out / "pretrain.png")
    return records


def _plot(curves: dict, records: list[dict], path: Path) -> None:
    matplotlib.use("Agg")

    archs = sorted({k[0] for k in curves})
    fig, axes = plt.subplots(1, len(archs) + 1, figsize=(4.2 * (len(archs) + 1), 3.6))
    axes = np.atleast_1d(axes)
    for ax, arch in zip(axes, archs, strict=False):
        for (a, enc, seed), hist in curves.items():
            if a != arch:
                continue
            ep = [h["epoch"] for h in hist]
            line, = ax.plot(ep, [h["train_loss"] for h in hist], label=f"{enc} (train)" if seed == 0 else None)
            ax.plot(ep, [h["val_loss"] for h in hist], ls="--", color=line.get_color())
        ax.set_title(f"{arch}: masked-value loss (dashed: validation)")
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_ylabel("loss")
        ax.legend(fontsize=7)
    speed = {}
    for r in records:
        if r["metric"] == "cells_per_s":
            speed.setdefault(f"{r['architecture']}\n{r['encoding']}", []).append(r["value"])
    ax = axes[-1]
    names = list(speed)
    ax.bar(range(len(names)), [np.mean(v) for v in speed.values()],
           yerr=[np.std(v) if len(v) > 1 else 0 for v in speed.values()])
    ax.set_xticks(range(len(names)), names, fontsize=6, rotation=60)
    ax.set_ylabel("cells / s (training)")
    ax.set_title("pretraining throughput")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
