"""Paired comparisons over seeds: each encoding minus a reference (the backbone's default, CAPE-null) on the same
seeds, with a 95 % t interval, a verdict and the smallest difference the design could have detected.

Seeds pair the runs: the same seed gives both models the same split, initial weights of the shared parts and
batches, so the per-seed difference removes the split-to-split spread that dominates a 3-seed table.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

LEVEL = 0.95

#: Power at which :func:`minimum_detectable_difference` is stated (the usual 80 %).
POWER = 0.8

#: The scores a paired table reports per task (the benchmark records more).
PRIMARY_METRICS = {
    "annotation": ("accuracy", "macro_f1"),
    "clustering": ("ARI", "NMI"),
    "perturbation": ("mse_overall", "pearson_delta_overall", "mse_downstream_overall",
                     "pearson_delta_downstream_overall"),
}

VERDICTS = ("better", "no detectable difference", "worse")


def paired_interval(differences: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """Mean of the per-seed differences and its two-sided Student-t interval; NaN bounds below two pairs."""
    d = np.asarray(differences, dtype=np.float64)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(d.mean())
    if d.size < 2:
        return mean, float("nan"), float("nan")
    half = stats.t.ppf(0.5 + level / 2, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size)
    return mean, mean - float(half), mean + float(half)


def minimum_detectable_difference(sd: float, n: int, level: float = LEVEL, power: float = POWER) -> float:
    """Smallest true mean difference a two-sided paired t test at ``level`` detects with probability ``power``,
    given the per-seed differences' standard deviation ``sd`` over ``n`` pairs (normal-theory approximation:
    ``(t_{1-α/2} + t_{power}) · sd / √n`` with n − 1 degrees of freedom)."""
    if n < 2 or not np.isfinite(sd):
        return float("nan")
    df = n - 1
    return float((stats.t.ppf(0.5 + level / 2, df) + stats.t.ppf(power, df)) * sd / np.sqrt(n))


def verdict(low: float, high: float, lower_is_better: bool = False) -> str:
    """``better`` / ``worse`` when the interval excludes 0 on that side, else ``no detectable difference``."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return "no detectable difference"
    if low > 0:
        return "worse" if lower_is_better else "better"
    if high < 0:
        return "better" if lower_is_better else "worse"
    return "no detectable difference"


def paired_differences(records: Sequence[dict], references: dict[str, dict[str, str]],
                       metrics: Sequence[str], lower_is_better: set[str] | frozenset[str] = frozenset(),
                       level: float = LEVEL) -> pd.DataFrame:
    """Every model row against each reference on the seeds both ran.

    ``records``: benchmark records (``kind == "model"`` with ``backbone, integration, encoding, seed, metric,
    value``). ``references``: ``{reference label: {backbone: encoding}}`` (e.g. ``{"default": {"scgpt":
    "trainable_absolute", ...}, "cape_null": {"scgpt": "cape_null", ...}}``). Returns one row per backbone,
    integration, encoding, metric and reference: ``n``, ``difference`` (encoding − reference), ``low``/``high``,
    ``verdict`` and ``mdd`` (minimum detectable difference at 80 % power).
    """
    rows = [r for r in records if r.get("kind") == "model" and r.get("metric") in metrics
            and r.get("value") is not None and r.get("seed") is not None]
    if not rows:
        return pd.DataFrame(columns=["backbone", "integration", "encoding", "metric", "reference", "n", "difference",
                                     "low", "high", "verdict", "mdd"])
    frame = pd.DataFrame(rows)
    if "integration" not in frame:
        frame["integration"] = None
    frame["integration"] = frame["integration"].fillna("")
    frame["value"] = frame["value"].astype(float)
    wide = frame.pivot_table(index=["backbone", "integration", "metric", "seed"], columns="encoding",
                             values="value", aggfunc="first")
    out = []
    for (backbone, integration, metric), block in wide.groupby(level=[0, 1, 2], sort=False):
        for ref_label, by_backbone in references.items():
            ref = by_backbone.get(backbone)
            if ref is None or ref not in block.columns:
                continue
            for encoding in block.columns:
                if encoding == ref:
                    continue
                pair = block[[encoding, ref]].dropna()
                if pair.empty:
                    continue
                d = (pair[encoding] - pair[ref]).to_numpy()
                mean, low, high = paired_interval(d, level)
                sd = float(np.std(d, ddof=1)) if d.size > 1 else float("nan")
                out.append({"backbone": backbone, "integration": integration, "encoding": encoding,
                            "metric": metric, "reference": ref_label, "n": int(d.size), "difference": mean,
                            "low": low, "high": high, "verdict": verdict(low, high, metric in lower_is_better),
                            "mdd": minimum_detectable_difference(sd, d.size, level)})
    return pd.DataFrame(out)


def paired_table(frame: pd.DataFrame, digits: int = 3) -> str:
    """Markdown: one row per backbone (integration) × encoding × metric, one column group per reference."""
    if frame.empty:
        return ""
    refs = list(dict.fromkeys(frame["reference"]))
    head = "| backbone | encoding | metric | n | " + " | ".join(
        f"Δ vs {r} [95 % CI] | verdict | MDD" for r in refs) + " |"
    lines = [head, "|---|---|---|---|" + "---|---|---|" * len(refs)]
    keys = ["backbone", "integration", "encoding", "metric"]
    for key, block in frame.groupby(keys, sort=False):
        backbone, integration, encoding, metric = key
        label = f"{backbone} ({integration})" if integration else backbone
        cells, n = [], int(block["n"].max())
        for r in refs:
            row = block[block["reference"] == r]
            if row.empty:
                cells += ["–", "–", "–"]
                continue
            row = row.iloc[0]
            ci = (f" [{row['low']:+.{digits}f}, {row['high']:+.{digits}f}]" if np.isfinite(row["low"]) else "")
            mdd = f"{row['mdd']:.{digits}f}" if np.isfinite(row["mdd"]) else "–"
            cells += [f"{row['difference']:+.{digits}f}{ci}", row["verdict"], mdd]
        lines.append(f"| {label} | {encoding} | {metric} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
