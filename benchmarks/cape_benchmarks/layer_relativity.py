"""``cape encodings relativity``: per-layer non-relativity of models trained with each encoding, before and after
masked-value pretraining (the measurement itself is :func:`cape.tasks.attention_diagnostic.layer_non_relativity`)."""

from __future__ import annotations

import logging
from pathlib import Path

import anndata as ad
import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
import torch

from cape import encodings as registry
from cape._errors import CapeInputError
from cape._io import save_figure, write_json, write_text
from cape._tables import mean_sd_table
from cape.models import CellTransformer
from cape.tasks.attention_diagnostic import layer_non_relativity

logger = logging.getLogger("cape")

DEFAULT_ENCODINGS = ("none", "trainable_absolute", "rope", "cape")


def run_benchmark(adata: ad.AnnData, out, *, dataset: str = "data", encodings: list[str] | None = None,
                  architecture: str = "scgpt", epochs: int = 5, seeds: tuple[int, ...] | list[int] = (0,),
                  n_cells: int | None = 256, d_model: int = 64, n_layers: int = 2, n_heads: int = 4,
                  max_len: int = 256, threads: int = 2) -> list[dict]:
    """Per-layer non-relativity before and after masked-value pretraining, per encoding; writes
    ``<out>/non_relativity.{json,md,png}`` and returns the records.

    ``adata`` must carry the CAPE keys (``varp["cape_dag"]``, ``varm["cape_poincare"]``, ``varm["cape_angles"]``:
    e.g. ``results/<dataset>/encoded.h5ad`` of the workflow), so that every model is also measured against the
    same causal geometry (key ``cape_poincare``).
    """

    missing = [k for k, slot in (("cape_poincare", adata.varm), ("cape_angles", adata.varm),
                                 ("cape_dag", adata.varp)) if k not in slot]
    if missing:
        raise CapeInputError(f"the input lacks {', '.join(missing)}: run Steps I–III first (e.g. the workflow's "
                             "results/<dataset>/encoded.h5ad)")
    encodings = list(encodings or DEFAULT_ENCODINGS)
    unknown = [e for e in encodings if e not in registry.available()]
    if unknown:
        raise CapeInputError(f"unknown encoding(s) {unknown}; available: {', '.join(registry.available())}")
    if epochs < 1:
        raise CapeInputError(f"epochs must be at least 1, got {epochs}")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    records: list[dict] = []
    try:
        for enc in encodings:
            for seed in seeds:
                model = CellTransformer(adata, architecture, enc, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                                        max_len=max_len, seed=seed, device="cpu")
                for stage in ("initial", "trained"):
                    if stage == "trained":
                        model.pretrain(adata, epochs=epochs, validation_fraction=0.1, early_stopping_patience=None)
                    for key in ("model", "cape_poincare"):
                        try:
                            rows = layer_non_relativity(model, adata, key=key, n_cells=n_cells, seed=seed)
                        except CapeInputError as err:  # e.g. an encoding without positions, against "model"
                            logger.info("%s against %s skipped: %s", enc, key, err)
                            continue
                        label = "own positions" if key == "model" else "Poincaré distance"
                        records.extend({"dataset": dataset, "architecture": architecture, "encoding": enc,
                                        "seed": seed, "stage": stage, "key": label, "metric": f"layer {r['layer']}",
                                        "value": r["nri"], "n_pairs": r["n_pairs"]} for r in rows)
    finally:
        torch.set_num_threads(previous)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(records, out / "non_relativity.json")
    note = (f"Behind-RoPE non-relativity index (0 = attention logits depend on the relative position only, ~1 = "
            f"unrelated to it) per layer of {architecture} models on {dataset} ({adata.n_obs} cells), before and "
            f"after {epochs} epoch(s) of masked-value pretraining; mean logits over heads and ≤ {n_cells} cells, "
            "gene pairs seen together in ≥ 3 cells, 32 quantile bins of the relative key. 'own positions': the "
            "encoding's positions (DAG order offset for RoPE, angle distance for CAPE); 'Poincaré distance': Step "
            "II's d_P for every model. mean ± sd over seeds.\n\n")
    table = mean_sd_table(records, rows=["encoding", "key", "stage"], columns=["metric"])
    write_text(note + table + "\n", out / "non_relativity.md")
    _plot(records, out / "non_relativity.png")
    return records


def _plot(records: list[dict], path) -> None:
    matplotlib.use("Agg")

    frame = pd.DataFrame(records)
    keys = list(dict.fromkeys(frame["key"]))
    fig, axes = plt.subplots(1, len(keys), figsize=(5.0 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        sub = frame[(frame["key"] == key) & (frame["stage"] == "trained")]
        for enc, rows in sub.groupby("encoding", sort=False):
            mean = rows.groupby("metric", sort=False)["value"].mean()
            layers = [int(m.split()[-1]) for m in mean.index]
            ax.plot(layers, mean.to_numpy(), marker="o", label=enc)
        ax.set_xlabel("layer")
        ax.set_ylabel("non-relativity index")
        ax.set_ylim(0, 1.05)
        ax.set_title(f"after pretraining, against {key}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
