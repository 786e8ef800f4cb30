"""The outputs of ``cape-bench encodings``: the summary frame, the markdown table (mean ± sd over seeds and the
difference to each backbone's default encoding), the report text and the plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd

from cape._errors import CapeInputError
from cape._io import save_figure

from .encodings_controls import CONTROL_WORDS
from .encodings_models import DEFAULT_ENCODING, LOWER_IS_BETTER, METRICS, BenchmarkResult, BenchSettings
from .paired import PRIMARY_METRICS, paired_differences, paired_table


# ----------------------------------------------------------------------------------------------------------------
# tables and plot
# ----------------------------------------------------------------------------------------------------------------
def row_labels(record: dict) -> tuple[str, str]:
    """(backbone label, encoding label) of a record's table row: the backbone with its integration mode, and the
    encoding marked ``[softmax]`` where scBERT ran it with exact softmax attention instead of Performer."""
    backbone, encoding = str(record["backbone"]), str(record["encoding"])
    if record.get("integration"):
        backbone = f"{backbone} ({record['integration']})"
    if record.get("attention") == "softmax" and record["backbone"] == "scbert":
        encoding = f"{encoding} [softmax]"
    return backbone, encoding


def _architecture(backbone_label: str) -> str:
    return backbone_label.split(" ")[0]


def summary_frame(records: Sequence[dict]) -> pd.DataFrame:
    """Mean, sd and count per (backbone, encoding, metric) over seeds, for model and baseline rows (labels from
    :func:`row_labels`)."""
    rows = []
    for r in records:
        if r.get("kind") in ("model", "baseline"):
            backbone, encoding = row_labels(r)
            rows.append({**r, "backbone": backbone, "encoding": encoding})
    frame = pd.DataFrame(rows)
    if frame.empty:
        raise CapeInputError("the benchmark produced no model or baseline records")
    frame["value"] = frame["value"].astype(float)
    return (frame.groupby(["backbone", "encoding", "metric"], sort=False)["value"]
            .agg(["mean", "std", "count"]).reset_index())


def results_table(records: Sequence[dict], task: str, metrics: Sequence[str] | None = None, digits: int = 3
                  ) -> str:
    """Markdown in the paper tables' shape: rows backbone × encoding, ``mean ± sd (Δ to the default)``."""
    stats = summary_frame(records)
    measured = set(stats.loc[stats["mean"].notna(), "metric"])
    metrics = [m for m in (metrics or METRICS[task]) if m in measured]
    lines = ["| backbone | encoding | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for backbone in dict.fromkeys(stats["backbone"]):
        sub = stats[stats["backbone"] == backbone]
        default = DEFAULT_ENCODING.get(_architecture(backbone))
        ref = sub[sub["encoding"] == default].set_index("metric")["mean"] if default else pd.Series(dtype=float)
        for enc in dict.fromkeys(sub["encoding"]):
            row = sub[sub["encoding"] == enc].set_index("metric")
            cells = []
            for m in metrics:
                if m not in row.index or pd.isna(row.loc[m, "mean"]):
                    cells.append("–")
                    continue
                mean, sd, n = row.loc[m, "mean"], row.loc[m, "std"], row.loc[m, "count"]
                cell = f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if n > 1 and not pd.isna(sd) else "")
                if enc != default and m in ref.index and not pd.isna(ref[m]):
                    cell += f" ({mean - ref[m]:+.{digits}f})"
                cells.append(cell)
            label = f"{enc} †" if enc == default else enc
            lines.append(f"| {backbone} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_frame(records: Sequence[dict], task: str) -> pd.DataFrame:
    """Each model row minus its backbone's default encoding, minus CAPE-null and minus CAPE on the true DAG (where
    they ran), paired by seed in the same integration mode (:func:`cape_benchmarks.paired.paired_differences`)."""
    encodings = {r.get("encoding") for r in records if r.get("kind") == "model"}
    references = {"default": dict(DEFAULT_ENCODING)}
    if "cape_null" in encodings:
        references["cape_null"] = {b: "cape_null" for b in DEFAULT_ENCODING}
    if "cape_oracle" in encodings:  # e.g. beside the controls: what the true DAG's structure adds over each
        references["cape_oracle"] = {b: "cape_oracle" for b in DEFAULT_ENCODING}
    return paired_differences(records, references, PRIMARY_METRICS[task], LOWER_IS_BETTER)


def markdown_report(result: BenchmarkResult, task: str, dataset: str, info: dict) -> str:
    records = result.records
    s = result.settings
    title = {"annotation": "cell-type annotation (paper Table S1)", "clustering": "cell clustering (Table S2)",
             "perturbation": "perturbation prediction (Tables 2-3)"}[task]
    seeds = ", ".join(map(str, info["seeds"]))
    better = "lower is better" if task == "perturbation" else "higher is better"
    parts = [f"# Positional encodings: {title} on {dataset}", "",
             f"mean ± sd over seeds {seeds} ({better}); in parentheses the difference to the backbone's default "
             "encoding in the same integration mode (†: scGPT trainable_absolute, scBERT static_absolute). "
             "complement: the backbone keeps its gene-identity embedding (scGPT's gene table, scBERT's static "
             "co-expression embedding) beside the encoding; replace: the encoding takes its place (CAPE Supp. F.2; "
             "none there is the paper's CAPE-null, with no gene identity). [softmax]: scBERT with exact softmax "
             "attention, since Performer cannot add the encoding's logit term. Baselines ran in the same run on the "
             "same data" + (", on the same 30/70 split per seed." if task == "annotation" else "."), "",
             results_table(records, task), ""]
    if len(info["seeds"]) > 1:
        parts += ["## Paired differences over seeds", "",
                  "Each encoding minus the reference on the same seed (same split, same backbone and integration "
                  "mode); mean and 95 % Student-t interval over the seeds; verdict: better / worse when the "
                  "interval excludes 0 (for MSE lower is better), else no detectable difference; MDD: the smallest "
                  "true difference this many seeds detect with 80 % power at the observed seed-to-seed spread.", "",
                  paired_table(paired_frame(records, task)), ""]
    controls = {r["encoding"]: r["control"] for r in records if r.get("kind") == "model" and r.get("control")}
    if controls:
        parts += ["Controls (a new draw per seed, seeded by it): " + "; ".join(
            f"{name}: {CONTROL_WORDS[control]}" for name, control in controls.items()) + ".", ""]
    skipped = [r for r in records if r.get("kind") == "skipped"]
    if skipped:
        parts += ["Not run: " + "; ".join(f"{r['encoding']} on {' '.join(row_labels(r)[:1])} ({r['reason']})"
                                          for r in skipped) + ".", ""]
    pos = [r for r in records if r.get("kind") == "positions"]
    if pos:
        parts += ["Positions (computed once, seed "
                  f"{pos[0]['seed']}, shared by every seed and encoding): "
                  + "; ".join(f"{r['position_set']} {r['step']} {r['metric']} = "
                              + (f"{r['value']:.1f}" if r["metric"] == "seconds" else f"{int(r['value'])}")
                              for r in pos) + ".", ""]
    bands = (f"; Step III: {s.bands} bands (ω up to ×{s.band_top:g}), cape_paper rows the low band"
             if s.bands > 1 else "")
    parts += [f"Data: {info['n_cells']} cells × {info['n_genes']} genes. Backbones: d_model {s.d_model}, "
              f"{s.n_layers} layers, {s.n_heads} heads, ≤ {s.max_len} tokens/cell, batch {s.batch_size}, lr {s.lr}; "
              f"dropout {s.dropout}; {_pretrain_note(task, s)}; {_task_note(task, s)} Step I: {s.causal_epochs} "
              f"epochs, rank {s.causal_rank}, τ {s.causal_tau}; Step II: d {s.embed_dim}, {s.embed_epochs} epochs"
              f"{bands}; "
              f"w/o-CSL graph: |corr| {s.corr_neighbors}-NN. "
              f"Wall time {result.seconds / 60:.1f} min (CPU time {result.cpu_seconds / 60:.1f} min, workers "
              f"included) on "
              f"{info['cpu_count']} CPU core(s) ({info['machine']}, "
              f"{info['threads']} torch thread(s), 1-min load average at the end {info['load_average']:.1f})"
              + (" — quick mode." if info["quick"] else "."), ""]
    return "\n".join(parts)


def _pretrain_note(task: str, s: BenchSettings) -> str:
    epochs = s.annotation_pretrain_epochs if task == "annotation" else s.pretrain_epochs
    if epochs == 0:
        return "no masked-value pretraining"
    stopping = ("every epoch run, the best on 10 % of the cells kept" if s.patience is None
                else f"early stopping patience {s.patience} on 10 % of the cells")
    return f"pretraining {epochs} epochs (masked values + cell profiles, {stopping})"


def _task_note(task: str, s: BenchSettings) -> str:
    if task == "annotation" and s.annotation_score_on == "validation":
        return (f"VALIDATION scores: fine-tuning ≤ {s.fine_tune_epochs} epochs on half of the 30 % fine-tune cells, "
                "scored on the other half (the 70 % test cells are not used); class-balanced loss, mean pooling, "
                f"early stopping with patience {s.fine_tune_patience} on 20 % of the fine-tune half.")
    if task == "annotation":
        return (f"fine-tuning ≤ {s.fine_tune_epochs} epochs on the 30 % split (class-balanced loss, mean pooling, "
                f"early stopping with patience {s.fine_tune_patience} on 20 % of it, never on test cells).")
    if task == "clustering":
        return "no label fine-tuning: k-means (k = number of labels) on the <cls> embedding."
    return (f"pretrained on control cells only; contextual gene embeddings → embedding predictor "
            f"({s.predictor_epochs} epochs); GEARS simulation split, seed 1.")


def plot_results(records: Sequence[dict], task: str, dataset: str, path: str | Path) -> Path:
    """Bars per encoding (mean ± sd over seeds), one panel per backbone × headline metric; baselines as lines."""

    matplotlib.use("Agg")

    stats = summary_frame(records)
    measured = set(stats.loc[stats["mean"].notna(), "metric"])  # e.g. no doubles in Sachs 2005
    metrics = [m for m in METRICS[task][: 2 if task == "perturbation" else 3] if m in measured]
    backbones = [b for b in dict.fromkeys(stats["backbone"]) if b != "baseline"]
    base = stats[stats["backbone"] == "baseline"]
    fig, axes = plt.subplots(len(metrics), max(len(backbones), 1),
                             figsize=(5.5 * max(len(backbones), 1), 2.8 * len(metrics)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    handles: dict = {}
    for j, backbone in enumerate(backbones):
        sub = stats[stats["backbone"] == backbone]
        encs = list(dict.fromkeys(sub["encoding"]))
        for i, m in enumerate(metrics):
            ax = axes[i, j]
            row = sub[sub["metric"] == m].set_index("encoding").reindex(encs)
            color = ["tab:red" if e.startswith("cape") else
                     ("tab:gray" if e == DEFAULT_ENCODING.get(_architecture(backbone)) else "tab:blue") for e in encs]
            sd = row["std"].where(row["count"] > 1)
            ax.bar(range(len(encs)), row["mean"], yerr=None if sd.isna().all() else sd.fillna(0), color=color,
                   capsize=2)
            for k, (bname, bsub) in enumerate(base[base["metric"] == m].groupby("encoding", sort=False)):
                line = ax.axhline(bsub["mean"].iloc[0], ls="--", lw=1, color=colors[(k + 2) % len(colors)])
                handles.setdefault(bname, line)
            finite = row["mean"].dropna()
            if len(finite):
                lo, hi = finite.min(), finite.max()
                lo = min([lo, *base[base["metric"] == m]["mean"]])
                hi = max([hi, *base[base["metric"] == m]["mean"]])
                pad = 0.15 * (hi - lo) + 1e-3
                ax.set_ylim(max(lo - pad, 0 if lo >= 0 else lo - pad), hi + pad)
            ax.set_xticks(range(len(encs)), encs, rotation=60, ha="right", fontsize=7)
            ax.set_ylabel(m + (" (↓)" if m in LOWER_IS_BETTER else " (↑)"))
            ax.set_title(f"{backbone}: {m}", fontsize=9)
    fig.suptitle(f"{task} on {dataset}: grey = backbone's default encoding, red = CAPE and its ablations; "
                 "dashed = baselines", fontsize=10)
    fig.tight_layout()
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="upper right", fontsize=7, frameon=False,
                   bbox_to_anchor=(1.0, 1.0))
    save_figure(fig, path)
    plt.close(fig)
    return Path(path)
