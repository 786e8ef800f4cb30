"""The perturbation workflow's outputs (``cape perturb``): every predictor against the better trivial baseline with a
paired bootstrap interval over the held-out perturbations, the verdict, ``report.md``, ``metrics.json``, the
per-perturbation and split tables and the plot of predicted against observed shifts."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .._io import atomic_path, save_figure, write_json, write_text
from .._tables import markdown_table
from ..pl import perturbation_shifts
from ..tasks.perturbation import SUBGROUPS
from ..tasks.perturbation_workflow import TRIVIAL, PerturbationRun, split_table
from .statistics import LEVEL, N_BOOTSTRAP, bootstrap_mean

#: The per-perturbation scores compared, and whether lower is better.
METRICS = {"top_de_mse": True, "pearson_delta": False}

#: Pairs compared besides every predictor against the better trivial baseline: what the training perturbations as
#: interventions add to Step I.
PAIRS = (("scm_interventional", "scm_control"),)

#: What the Step I predictors set a perturbed gene to, per ``perturb.target_value``.
TARGET_VALUE_TEXT = {
    "zero": "0, do(x = 0): a knock-out",
    "training": "its mean level in the cells of the training perturbations that target it; a gene no training "
                "perturbation targets, its control mean plus the training targets' median shift",
}

#: One line per predictor of the workflow, for the report.
PREDICTORS = {
    "no_change": "the control mean for every perturbation",
    "train_mean": "the mean of the training perturbations' mean profiles, the same for every perturbation",
    "additive": "control mean plus the sum of the perturbed genes' training single shifts",
    "linear": "Ahlmann-Eltze, Huber & Anders (2025): PCA gene embedding of the training pseudobulks, ridge "
              "bilinear map",
    "scm_control": "Step I's learned structural equations fitted on the control cells only",
    "scm_interventional": "Step I's learned equations fitted on the control cells and the training perturbations "
                          "as interventions",
    "scm_interventional_linear": "the interventional Step I graph, each gene refit on its parents by least squares "
                                 "on the control cells",
    "transformer": "gene embeddings of a transformer with CAPE positions (from the interventional graph) "
                   "pretrained on control cells, fed to the embedding predictor",
    "gears": "GEARS (Roohani et al. 2023) trained on the training perturbations (a tenth kept to pick its epoch); "
             "Gene Ontology replaced by the interventional Step I graph unless perturb.gears_go_graph gives GEARS' "
             "file",
}


def _verdict(low: float, high: float, lower_is_better: bool) -> str:
    """``better`` / ``worse`` when the interval excludes 0 on that side, else ``no detectable difference``."""
    if np.isfinite(low) and np.isfinite(high) and (low > 0 or high < 0):
        return "better" if (high < 0) == lower_is_better else "worse"
    return "no detectable difference"


def comparisons(per_perturbation: pd.DataFrame, *, n_boot: int = N_BOOTSTRAP, seed: int = 0) -> pd.DataFrame:
    """Each predictor minus the better trivial baseline (no change or the training mean, by the metric's mean), per
    metric, overall and per subgroup: the mean paired difference over held-out perturbations and its bootstrap
    interval, and whether the interval says better, worse or no detectable difference."""
    rows = []
    for metric, lower in METRICS.items():
        scores = per_perturbation.pivot(index="condition", columns="predictor", values=metric)
        means = scores.mean()
        trivial = [p for p in TRIVIAL if p in scores]
        base = (means[trivial].idxmin() if lower else means[trivial].idxmax()) if trivial else None
        subgroup = per_perturbation.drop_duplicates("condition").set_index("condition")["subgroup"]
        pairs = [(p, base) for p in scores.columns if base is not None and p != base]
        pairs += [pair for pair in PAIRS if set(pair) <= set(scores.columns)]
        for predictor, reference in pairs:
            diff = scores[predictor] - scores[reference]
            for group in ("overall", *SUBGROUPS):
                d = diff if group == "overall" else diff[subgroup.reindex(diff.index) == group]
                if d.empty:
                    continue
                mean, low, high = bootstrap_mean(d.to_numpy(), n_boot=n_boot, seed=seed)
                rows.append({"metric": metric, "predictor": predictor, "baseline": reference, "subgroup": group,
                             "n": int(d.size), "difference": mean, "low": low, "high": high,
                             "verdict": _verdict(low, high, lower)})
    return pd.DataFrame(rows)


def _against_trivial(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The overall rows of ``metric`` against the better trivial baseline, indexed by predictor."""
    rows = table[(table["metric"] == metric) & (table["subgroup"] == "overall") & table["baseline"].isin(TRIVIAL)]
    return rows.set_index("predictor")


def _pairs_text(table: pd.DataFrame) -> list[str]:
    """One line per extra pair (:data:`PAIRS`) and metric: the paired difference overall, with its interval."""
    rows = table[(table["subgroup"] == "overall") & ~table["baseline"].isin(TRIVIAL)]
    return [f"- {r['metric']}: {r['predictor']} − {r['baseline']} = {_interval(r)} over {r['n']} held-out "
            f"perturbations ({r['verdict']})" for r in rows.to_dict("records")]


def _fmt(value: float, digits: int = 3) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{value:.{digits}g}"


def _interval(row) -> str:
    return f"{_fmt(row['difference'])} [{_fmt(row['low'])}, {_fmt(row['high'])}]"


def verdict_lines(per_perturbation: pd.DataFrame, table: pd.DataFrame, n_de: int) -> list[str]:
    """The report's first lines: the best predictor by top-DE MSE against the better trivial baseline, with the
    interval, saying plainly when nothing beats it; then the same for ``pearson_delta``."""
    lines = []
    for metric, lower in METRICS.items():
        label = f"top-{n_de}-DE MSE" if metric == "top_de_mse" else "pearson_delta"
        means = per_perturbation.groupby("predictor")[metric].mean()
        best = means.idxmin() if lower else means.idxmax()
        rows = _against_trivial(table, metric)
        if rows.empty:
            continue
        base = rows["baseline"].iloc[0]
        n = int(rows["n"].iloc[0])
        better = rows[rows["verdict"] == "better"]
        level = f"{LEVEL:.0%} bootstrap interval over {n} held-out perturbations"
        if best == base or best not in better.index:
            runner = (means.drop(base).idxmin() if lower else means.drop(base).idxmax())
            lines.append(f"**{label}: nothing beats {base}** (the better trivial baseline, {_fmt(means[base])}): "
                         f"the best other predictor, {runner} ({_fmt(means[runner])}), differs by "
                         f"{_interval(rows.loc[runner])} ({level}).")
        else:
            others = ", ".join(p for p in better.index if p != best)
            lines.append(f"**{label}: {best} predicts best** ({_fmt(means[best])} against {_fmt(means[base])} for "
                         f"{base}, the better trivial baseline): difference {_interval(rows.loc[best])} ({level})"
                         + (f"; also better than {base}: {others}." if others else "; no other predictor is."))
    return lines


def _scores_table(run: PerturbationRun, table: pd.DataFrame) -> str:
    per = run.per_perturbation
    mse_rows, r_rows = _against_trivial(table, "top_de_mse"), _against_trivial(table, "pearson_delta")
    rows = []
    for p, scores in per.groupby("predictor", sort=False):
        rows.append([p, _fmt(scores["top_de_mse"].mean()),
                     _interval(mse_rows.loc[p]) if p in mse_rows.index else "(baseline)",
                     _fmt(scores["pearson_delta"].mean()),
                     _interval(r_rows.loc[p]) if p in r_rows.index else "(baseline)",
                     f"{run.metrics[p]['seconds']:.1f}"])
    header = ["predictor", "top-DE MSE", f"vs {mse_rows['baseline'].iloc[0]}" if len(mse_rows) else "difference",
              "pearson_delta", f"vs {r_rows['baseline'].iloc[0]}" if len(r_rows) else "difference", "fit + predict s"]
    return markdown_table(header, rows)


def _subgroup_table(run: PerturbationRun) -> str:
    per = run.per_perturbation
    groups = [g for g in SUBGROUPS if (per["subgroup"] == g).any()]
    counts = per.drop_duplicates("condition")["subgroup"].value_counts()
    means = per.groupby(["predictor", "subgroup"], sort=False)["top_de_mse"].mean()
    rows = [[p, *(_fmt(means.get((p, g), np.nan)) for g in groups)] for p in per["predictor"].unique()]
    return markdown_table(["predictor", *(f"{g} (n={counts.get(g, 0)})" for g in groups)], rows)


def _cell_eval_section(run: PerturbationRun) -> list[str]:
    """cell-eval's mean scores per predictor, when the run has them."""
    names = sorted({k for m in run.metrics.values() for k in m if k.startswith("cell_eval_")})
    if not names:
        return []
    rows = [[p, *(_fmt(run.metrics[p].get(k, np.nan)) for k in names)] for p in run.per_perturbation["predictor"]
            .unique()]
    return ["## cell-eval", "", "The Virtual Cell Challenge's evaluator (cell-eval, profile minimal), means over the "
            "held-out perturbations. Predicted cells are control cells moved to each predicted mean, so the metrics "
            "of means (pearson_delta over all genes, mse, mae, discrimination_score) are exact; the DE metrics also "
            "read the control cells' spread.", "",
            markdown_table(["predictor", *(k.removeprefix("cell_eval_") for k in names)], rows), ""]


def report_text(run: PerturbationRun, table: pd.DataFrame, *, name: str, plot: str | None) -> str:
    """``report.md``: the verdict first, then the scores, the subgroups, the split and the predictors."""
    split = split_table(run.task)
    roles = split.groupby(["role", "subgroup"]).size()
    verdict = verdict_lines(run.per_perturbation, table, len(next(iter(run.task.de.values()))))
    parts = [f"# cape perturbation run: {name}", "", "\n\n".join(verdict), "",
             "## Scores", "", "Means over the held-out perturbations; differences to the better trivial baseline "
             f"with {LEVEL:.0%} paired bootstrap intervals over perturbations (negative MSE difference: better).", "",
             _scores_table(run, table), "", "## Step I with and without the training perturbations", "",
             *(_pairs_text(table) or ["- not compared (a Step I predictor is missing)"]), "",
             "## Top-DE MSE per subgroup", "", _subgroup_table(run), "", *_cell_eval_section(run),
             "## Split", "", "GEARS' simulation split: whole perturbations held out (split.tsv).", "",
             markdown_table(["role", "subgroup", "perturbations"], [[r, g, str(n)] for (r, g), n in roles.items()]),
             "", "## Predictors", ""]
    parts += [f"- **{p}**: {PREDICTORS.get(p, '')}" for p in run.per_perturbation["predictor"].unique()]
    if run.per_perturbation["predictor"].str.startswith("scm_").any():
        parts += ["", f"The Step I predictors set each perturbed gene to {TARGET_VALUE_TEXT[run.target_value]} "
                      f"(perturb.target_value: {run.target_value})."]
    if plot:
        parts += ["", "## Predicted against observed shifts", "", f"![shifts]({plot})"]
    return "\n".join(parts) + "\n"


def shifts_figure(run: PerturbationRun, n_conditions: int = 4):
    """:func:`cape.pl.perturbation_shifts` of every predictor on a few held-out perturbations, one per subgroup
    where there are."""
    test = run.task.split.test
    by_group = [next(c for c in test if run.task.split.subgroup[c] == g) for g in SUBGROUPS
                if any(run.task.split.subgroup[c] == g for c in test)]
    shown = list(dict.fromkeys(by_group + test))[:n_conditions]
    return perturbation_shifts(run.predicted, run.task.truth, run.task.control_mean, run.task.de, conditions=shown,
                               return_fig=True)


def metric_records(run: PerturbationRun, table: pd.DataFrame, *, name: str, seed: int) -> list[dict]:
    """``metrics.json``: every predictor's summary scores (``task="perturbation"``) and each comparison
    (``task="comparison"``: difference, interval, perturbations resampled)."""
    records = [{"task": "perturbation", "dataset": name, "method": p, "seed": seed, "metric": k, "value": float(v)}
               for p, summary in run.metrics.items() for k, v in summary.items()]
    for row in table.to_dict("records"):
        method = f"perturbation {row['metric']} ({row['subgroup']}): {row['predictor']} vs {row['baseline']}"
        records += [{"task": "comparison", "dataset": name, "method": method, "seed": seed, "metric": k,
                     "value": float(row[key])}
                    for k, key in (("difference", "difference"), ("low", "low"), ("high", "high"),
                                   ("perturbations resampled", "n"))]
    return records


def write_perturbation_outputs(run: PerturbationRun, out_dir: str | os.PathLike, *, name: str, seed: int = 0,
                               n_boot: int = N_BOOTSTRAP) -> list[Path]:
    """Write ``metrics.json``, ``per_perturbation.tsv``, ``split.tsv``, ``report.md`` and ``shifts.png`` into
    ``out_dir``; everything is computed before the first file is written."""
    table = comparisons(run.per_perturbation, n_boot=n_boot, seed=seed)
    records = metric_records(run, table, name=name, seed=seed)
    text = report_text(run, table, name=name, plot="shifts.png")
    split = split_table(run.task)
    fig = shifts_figure(run)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "per_perturbation.tsv", out / "split.tsv"]
    for frame, path in zip((run.per_perturbation, split), paths, strict=True):
        with atomic_path(path) as tmp:
            frame.to_csv(tmp, sep="\t", index=False)
    save_figure(fig, out / "shifts.png")
    plt.close(fig)
    write_json(records, out / "metrics.json")
    write_text(text, out / "report.md")
    return [*paths, out / "shifts.png", out / "metrics.json", out / "report.md"]
