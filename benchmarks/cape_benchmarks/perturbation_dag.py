"""``cape-bench perturbation-dag``: the perturbation workflow's predictors on data whose gene DAG is known.

Every member draws a new dataset and a new split per seed, runs :func:`cape.tasks.run_perturbation_workflow`
(the predictors are the workflow's own: no change, training mean, additive, linear (Ahlmann-Eltze et al.), Step I
on the control cells (``scm_control``), Step I with the training perturbations as interventions
(``scm_interventional``) and its least-squares refit; the transformer only with ``transformer=True``) and keeps
every held-out perturbation's scores.

Members (:data:`MEMBERS`):

* ``grn50``, ``grn200``: :func:`cape.data.simulate_grn_cells` (counts from a random DAG with Hill regulation,
  cell types, library sizes and dropout; log1p of counts per 10,000), single and double knock-outs do(x = 0), at 50
  and 200 genes; a new DAG per seed.
* ``bn_ecoli70``: bnlearn's linear Gaussian network ecoli70 (:mod:`cape.data.gaussian_bn`), single knock-downs
  do(x = μ − 3σ) of its 22 genes with descendants; the network is fixed, the cells are drawn anew per seed. Each
  gene is shifted by its lowest value in the draw, so that expression is non-negative as cell-eval requires (a
  per-gene shift leaves a linear Gaussian network one on the same DAG and changes no mean difference). The Step I
  predictors set a target to its level in the training perturbations (``target_value="training"``, unseen targets
  moved by the training targets' median shift): a knock-down is not do(x = 0).
* ``sergio_ecoli70``: SERGIO's counts (:mod:`cape_benchmarks.sergio`, GPL-3, its own environment: ``make
  sergio-env``) on ecoli70's DAG and signs, 5 cell types; knock-outs (the 22 genes with descendants alone, and
  random pairs of them) made by editing SERGIO's set-up network (``_sergio_child.py``; SERGIO 1.9.3 has no
  perturbation API); log1p of counts per 10,000. SERGIO's parameters and cells are drawn anew per seed.

Scores per held-out perturbation: top-20-DE MSE (``top_de_mse``), cape's ``pearson_delta`` (top-DE genes), both
again over the top-20 DE genes less the perturbed genes themselves (``*_downstream``: a knock-out's own drop is
usually its largest DE effect, and Step I's predictors set the target by construction), and cell-eval's metrics
(``cell_eval_*``, where ``cell-eval`` is installed; :data:`CORRELATION` is its main correlation, ``pearson_delta``
over all genes). Summaries (:func:`seed_means`, :func:`paired_comparisons`): per seed the mean over
the perturbations of a subgroup, the median over seeds; and paired differences (:data:`COMPARISONS`, Step I with
interventions minus linear, additive, the training mean and Step I on control cells) with two 95 % intervals: a
percentile bootstrap over the perturbations pooled across seeds (each perturbation paired with itself across
predictors), and a Student-t interval over the per-seed mean differences.

Outputs under ``out``: ``perturbation_dag.json`` (records), ``perturbation_dag.md`` and ``perturbation_dag.png``.
"""

from __future__ import annotations

import logging
import time
from itertools import combinations
from pathlib import Path

import anndata as ad
import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
import pandas as pd

from cape import data
from cape._errors import CapeInputError
from cape._io import save_figure, write_json, write_text
from cape._tables import markdown_table
from cape.data.gaussian_bn import read_gaussian_bn
from cape.data.perturbation_data import CONTROL, gears_condition
from cape.tasks.perturbation import condition_genes, downstream_de, top_de_mse, top_de_pearson_delta
from cape.tasks.perturbation_cell_eval import cell_eval_available
from cape.tasks.perturbation_workflow import PerturbationSettings, perturbation_data, run_perturbation_workflow

from .paired import paired_interval
from .sergio import simulate_sergio_knockouts

__all__ = ["COMPARISONS", "CORRELATION", "MEMBERS", "QUICK_MEMBERS", "member_data", "paired_comparisons",
           "run_perturbation_dag", "seed_means", "write_perturbation_dag"]

logger = logging.getLogger("cape")

#: The members' designs (module docstring). ``cells``: cells per perturbation; SERGIO's per cell type.
MEMBERS = {
    "grn50": {"kind": "grn", "n_genes": 50, "n_edges": 75, "n_control": 2000, "n_single": 20, "n_double": 20,
              "cells": 30},
    "grn200": {"kind": "grn", "n_genes": 200, "n_edges": 300, "n_control": 2000, "n_single": 30, "n_double": 30,
               "cells": 30},
    "bn_ecoli70": {"kind": "bn", "network": "ecoli70", "n_control": 2000, "cells": 40,
                   "target_value": "training"},
    "sergio_ecoli70": {"kind": "sergio", "network": "ecoli70", "n_types": 5, "cells_per_type": 400, "n_double": 20,
                       "cells": 8},
}
#: Tiny designs for ``--quick`` (smoke runs and tests).
QUICK_MEMBERS = {
    "grn50": {"kind": "grn", "n_genes": 12, "n_edges": 16, "n_control": 150, "n_single": 6, "n_double": 6,
              "cells": 8},
    "grn200": {"kind": "grn", "n_genes": 16, "n_edges": 22, "n_control": 150, "n_single": 6, "n_double": 6,
               "cells": 8},
    "bn_ecoli70": {"kind": "bn", "network": "ecoli70", "n_control": 150, "cells": 8, "target_value": "training"},
    "sergio_ecoli70": {"kind": "sergio", "network": "ecoli70", "n_types": 2, "cells_per_type": 60, "n_double": 4,
                       "cells": 5},
}
#: (minuend, subtrahend) of the paired differences.
COMPARISONS = (("scm_interventional", "linear"), ("scm_interventional", "additive"),
               ("scm_interventional", "train_mean"), ("scm_interventional", "scm_control"))
#: cell-eval's main correlation metric (Pearson correlation of predicted and observed change over all genes).
CORRELATION = "cell_eval_pearson_delta"
#: The metrics of the tables, and whether lower is better.
METRICS = {"top_de_mse": True, CORRELATION: False, "top_de_mse_downstream": True}
SUBGROUPS = ("unseen_single", "combo_seen0", "combo_seen1", "combo_seen2", "all")
BOOTSTRAP = 2000


def _ecoli70():
    return read_gaussian_bn(data.fetch("ecoli70")["network"], name="ecoli70")


def _regulators(weights: np.ndarray) -> list[int]:
    """The genes with at least one descendant, most descendants first (ties by index)."""
    graph = nx.from_numpy_array((weights != 0).astype(int), create_using=nx.DiGraph)
    reach = {g: len(nx.descendants(graph, g)) for g in range(weights.shape[0])}
    return sorted((g for g in reach if reach[g]), key=lambda g: (-reach[g], g))


def _bn_data(spec: dict, seed: int) -> ad.AnnData:
    bn = _ecoli70()
    genes = [bn.genes[g] for g in _regulators(bn.weights)]
    adata = bn.simulate(n_control=spec["n_control"], knockdowns=genes, cells_per_knockdown=spec["cells"], seed=seed)
    X = np.asarray(adata.X, dtype=np.float64)
    adata.X = (X - X.min(axis=0)).astype(np.float32)  # non-negative for cell-eval (module docstring)
    return adata


def _sergio_data(spec: dict, seed: int) -> ad.AnnData:
    """SERGIO's control and knock-out cells on ecoli70 as log1p of counts per 10,000, genes named as ecoli70's."""
    bn = _ecoli70()
    singles = _regulators(bn.weights)
    pairs = list(combinations(singles, 2))
    rng = np.random.default_rng(seed)
    doubles = [pairs[i] for i in sorted(rng.choice(len(pairs), size=spec["n_double"], replace=False))]
    knockouts = [(g,) for g in singles] + doubles
    counts, cell_type, condition, genes = simulate_sergio_knockouts(
        bn.weights, knockouts, n_types=spec["n_types"], cells_per_type=spec["cells_per_type"],
        knockout_cells_per_type=spec["cells"], seed=seed)
    names = [bn.genes[g] for g in genes]
    labels = np.array([CONTROL if k < 0 else gears_condition(tuple(bn.genes[g] for g in knockouts[k]))
                       for k in condition])
    total = counts.sum(axis=1)
    keep = total > 0  # SERGIO's dropout can empty a cell
    X = np.log1p(counts[keep] / total[keep, None] * 1e4)
    return ad.AnnData(X=X.astype(np.float32), obs=pd.DataFrame(
        {"condition": labels[keep], "cell_type": cell_type[keep].astype(str)},
        index=[f"cell{i}" for i in np.flatnonzero(keep)]), var=pd.DataFrame(index=names))


def member_data(member: str, spec: dict, seed: int) -> ad.AnnData:
    """One draw of ``member``'s data (module docstring) for ``seed``: cells × genes with GEARS labels in
    ``obs["condition"]``, non-negative log-scale ``X``, perturbations whose target never varies in the control
    cells left out (Step I refuses constant genes)."""
    kind = spec["kind"]
    if kind == "grn":
        adata = data.simulate_grn_cells(n_genes=spec["n_genes"], n_edges=spec["n_edges"], n_control=spec["n_control"],
                                        n_single=spec["n_single"], n_double=spec["n_double"],
                                        n_cells_per_perturbation=spec["cells"], seed=seed)
    elif kind == "bn":
        adata = _bn_data(spec, seed)
    elif kind == "sergio":
        adata = _sergio_data(spec, seed)
    else:
        raise CapeInputError(f"member {member!r}: unknown kind {kind!r}")
    labels = adata.obs["condition"].astype(str).to_numpy()
    X = np.asarray(adata.X.toarray() if hasattr(adata.X, "toarray") else adata.X)
    varies = X[labels == CONTROL].std(axis=0) > 0
    adata = adata[:, varies].copy()
    kept = set(adata.var_names)
    usable = [c == CONTROL or set(condition_genes(c)) <= kept for c in labels]
    if not all(usable):
        logger.info("%s seed %d: %d perturbation(s) left out (a target constant in the control cells)", member, seed,
                    len(set(labels[~np.asarray(usable)])))
    return adata[np.asarray(usable)].copy()


def _member_records(member: str, spec: dict, seed: int, settings: PerturbationSettings) -> list[dict]:
    """One seed of one member: a record per held-out perturbation, predictor and metric, and the times."""
    start = time.perf_counter()
    adata = member_data(member, spec, seed)
    pdata = perturbation_data(adata, "condition")
    run = run_perturbation_workflow(pdata, settings)
    seconds = time.perf_counter() - start
    base = {"member": member, "seed": seed, "target_value": run.target_value}
    frame = _with_downstream(run)
    metrics = [c for c in frame.columns if c not in ("predictor", "condition", "subgroup", "n_targets")]
    records = [{**base, "kind": "score", "predictor": row["predictor"], "condition": row["condition"],
                "subgroup": row["subgroup"], "n_targets": int(row["n_targets"]), "metric": m,
                "value": float(row[m])} for row in frame.to_dict("records") for m in metrics if pd.notna(row[m])]
    records += [{**base, "kind": "time", "predictor": name, "metric": "seconds", "value": float(v["seconds"])}
                for name, v in run.metrics.items()]
    split = run.task.split
    records.append({**base, "kind": "run", "metric": "seconds", "value": seconds, "n_cells": int(pdata.n_obs),
                    "n_genes": int(pdata.n_vars), "n_train": len(split.train), "n_val": len(split.val),
                    "n_test": len(split.test)})
    logger.info("perturbation-dag %s seed %d: %d cells × %d genes, %d held out, %.0f s", member, seed, pdata.n_obs,
                pdata.n_vars, len(split.test), seconds)
    return records


def _with_downstream(run) -> pd.DataFrame:
    """The run's per-perturbation table with the top-DE MSE and pearson_delta over the DE genes less the
    perturbed genes themselves (``*_downstream``, :func:`~cape.tasks.perturbation.downstream_de`): what a
    predictor knows beyond "the target moves"."""
    task, frame = run.task, run.per_perturbation.copy()
    downstream = downstream_de(task.de)
    control_mean = task.control_mean
    for name, means in run.predicted.items():
        rows = frame["predictor"] == name
        mse = top_de_mse(means, task.truth, downstream)
        pearson = top_de_pearson_delta(means, task.truth, control_mean, downstream)
        frame.loc[rows, "top_de_mse_downstream"] = frame.loc[rows, "condition"].map(mse).to_numpy()
        frame.loc[rows, "pearson_delta_downstream"] = frame.loc[rows, "condition"].map(pearson).to_numpy()
    return frame


def run_perturbation_dag(out: str | Path = "results/bench", *, quick: bool = False, members: list[str] | None = None,
                         seeds: int | None = None, seed_offset: int = 0, transformer: bool = False,
                         cell_eval: bool = True, causal_epochs: int = 30, causal_cells: int | None = 2000,
                         device: str = "cpu") -> list[dict]:
    """Run the benchmark (module docstring) and write its json/md/png under ``out``; returns the records.

    Parameters
    ----------
    out
        Output folder.
    quick
        Tiny designs (:data:`QUICK_MEMBERS`), one seed and 3 Step I epochs unless ``seeds`` says otherwise.
    members
        Which of :data:`MEMBERS` (default: all); a member that cannot run (SERGIO not installed) is noted and
        skipped.
    seeds, seed_offset
        Seeds ``seed_offset ..``: 5 by default (quick: 1). Seed ``s`` draws the data with ``s``, splits with ``s + 1``
        and seeds Step I with ``s``.
    transformer, cell_eval
        Whether to add the transformer predictor, and cell-eval's scores (where it is installed).
    causal_epochs, causal_cells, device
        Step I's epochs and most cells (the workflow's defaults), and the transformer's device.
    """
    designs = QUICK_MEMBERS if quick else MEMBERS
    members = list(members or designs)
    unknown = [m for m in members if m not in designs]
    if unknown:
        raise CapeInputError(f"unknown member(s) {', '.join(unknown)}; known: {', '.join(designs)}")
    n_seeds = seeds or (1 if quick else 5)
    epochs = 3 if quick else causal_epochs
    records: list[dict] = []
    for member in members:
        spec = designs[member]
        for seed in range(seed_offset, seed_offset + n_seeds):
            settings = PerturbationSettings(
                split_seed=seed + 1, seed=seed, causal_epochs=epochs, causal_cells=causal_cells,
                target_value=spec.get("target_value", "zero"), transformer=transformer, cell_eval=cell_eval,
                device=device, pretrain_epochs=1 if quick else 5, embed_epochs=20 if quick else 200,
                predictor_epochs=20 if quick else 400)
            try:
                records += _member_records(member, spec, seed, settings)
                write_json(records, Path(out) / "perturbation_dag.json")  # kept seed by seed
            except CapeInputError as err:
                if not str(err).startswith("SERGIO is not installed"):
                    raise
                records.append({"member": member, "kind": "note", "note": f"skipped: {err}"})
                logger.warning("perturbation-dag %s skipped: %s", member, err)
                break
    write_perturbation_dag(records, out, quick=quick, cell_eval=cell_eval)
    return records


def write_perturbation_dag(records: list[dict], out: str | Path, *, quick: bool = False, cell_eval: bool = True
                           ) -> None:
    """Write ``perturbation_dag.json``/``.md``/``.png`` under ``out`` from ``records`` (e.g. those of several runs
    of :func:`run_perturbation_dag` on different members, concatenated)."""
    designs = QUICK_MEMBERS if quick else MEMBERS
    members = [m for m in dict.fromkeys(r["member"] for r in records) if m in designs]
    out = Path(out)
    write_json(records, out / "perturbation_dag.json")
    write_text(_report(records, designs, members, quick, _notes(cell_eval)), out / "perturbation_dag.md")
    save_figure(_figure(records), out / "perturbation_dag.png")


def _notes(cell_eval: bool) -> list[str]:
    if not cell_eval:
        return ["cell-eval's scores are off (cell_eval=False): the correlation columns are empty."]
    if not cell_eval_available():
        return ['cell-eval is not installed (pip install "cape-sc[perturb]"): the correlation columns are empty.']
    return []


def _scores(records: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame([r for r in records if r.get("kind") == "score"])
    if frame.empty:
        return pd.DataFrame(columns=["member", "seed", "predictor", "condition", "subgroup", "metric", "value"])
    everything = frame.copy()
    everything["subgroup"] = "all"
    return pd.concat([frame, everything], ignore_index=True)


def seed_means(records: list[dict]) -> pd.DataFrame:
    """Per member, metric, predictor and subgroup (``all``: every held-out perturbation): the mean over the
    perturbations of each seed (columns ``seed``, ``value``, ``n`` perturbations)."""
    frame = _scores(records)
    keys = ["member", "metric", "predictor", "subgroup", "seed"]
    return frame.groupby(keys, sort=False)["value"].agg(value="mean", n="size").reset_index()


def _pairs(frame: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """``a``'s and ``b``'s values of the same perturbations (index: seed, condition)."""
    wide = frame[frame["predictor"].isin([a, b])].pivot_table(index=["seed", "condition"], columns="predictor",
                                                              values="value", aggfunc="first")
    return wide.dropna() if {a, b} <= set(wide.columns) else pd.DataFrame(columns=[a, b])


def paired_comparisons(records: list[dict], comparisons=COMPARISONS, metrics=tuple(METRICS),
                       n_boot: int = BOOTSTRAP, level: float = 0.95) -> pd.DataFrame:
    """Paired differences ``a − b`` per member, metric, subgroup and comparison (module docstring).

    Columns: ``n`` perturbations (pooled over seeds), ``seeds``, ``difference`` (mean over the pooled
    perturbations), ``low``/``high`` (percentile bootstrap over them, ``n_boot`` resamples, seeded),
    ``seed_difference``/``seed_low``/``seed_high`` (mean of the per-seed mean differences and its t interval) and
    ``seeds_better`` (seeds whose mean difference favours ``a``).
    """
    frame = _scores(records)
    frame = frame[frame["metric"].isin(metrics)]
    rng = np.random.default_rng(0)
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    rows = []
    for (member, metric, subgroup), block in frame.groupby(["member", "metric", "subgroup"], sort=False):
        for a, b in comparisons:
            pair = _pairs(block, a, b)
            if pair.empty:
                continue
            d = (pair[a] - pair[b]).to_numpy(dtype=float)
            boot = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)
            low, high = np.percentile(boot, q) if d.size > 1 else (np.nan, np.nan)
            per_seed = pd.Series(d, index=pair.index.get_level_values("seed")).groupby(level=0).mean()
            seed_mean, seed_low, seed_high = paired_interval(per_seed.to_numpy(), level)
            better = per_seed < 0 if METRICS.get(metric, False) else per_seed > 0
            rows.append({"member": member, "metric": metric, "subgroup": subgroup, "a": a, "b": b, "n": int(d.size),
                         "seeds": int(per_seed.size), "difference": float(d.mean()), "low": float(low),
                         "high": float(high), "seed_difference": seed_mean, "seed_low": seed_low,
                         "seed_high": seed_high, "seeds_better": int(better.sum())})
    return pd.DataFrame(rows)


LABELS = {"no_change": "no change", "train_mean": "training mean", "additive": "additive",
          "linear": "linear (Ahlmann-Eltze)", "scm_control": "Step I, control cells",
          "scm_interventional": "Step I, with interventions", "scm_interventional_linear": "its graph, LS refit",
          "transformer": "transformer"}
METRIC_LABELS = {"top_de_mse": "top-20-DE MSE (lower is better)",
                 CORRELATION: "cell-eval pearson_delta (higher is better)",
                 "top_de_mse_downstream": "top-20-DE MSE without the perturbed genes (lower is better)"}


def _fmt(x: float) -> str:
    if not np.isfinite(x):
        return "–"
    text = f"{x:.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.1e}"
    return text.replace("-", "−")


def _signed(x: float) -> str:
    return "–" if not np.isfinite(x) else ("+" if x >= 0 else "−") + _fmt(abs(x))


def _median_table(means: pd.DataFrame, member: str, metric: str) -> str:
    """Predictors × subgroups: the median over seeds of the per-seed means (min–max)."""
    part = means[(means["member"] == member) & (means["metric"] == metric)]
    subgroups = [s for s in SUBGROUPS if s in set(part["subgroup"])]
    header = ["predictor"]
    for s in subgroups:
        n = part[part["subgroup"] == s].groupby("seed")["n"].first()
        header.append(f"{s} ({int(n.sum())})")
    rows = []
    for predictor in dict.fromkeys(part["predictor"]):
        cells = [LABELS.get(predictor, predictor)]
        for s in subgroups:
            v = part[(part["predictor"] == predictor) & (part["subgroup"] == s)]["value"]
            cells.append(f"{_fmt(v.median())} ({_fmt(v.min())} … {_fmt(v.max())})" if len(v) else "–")
        rows.append(cells)
    return markdown_table(header, rows)


def _paired_table(paired: pd.DataFrame, member: str, seeds: bool) -> str:
    """Comparisons × subgroups: the mean difference and its interval (pooled bootstrap, or over seeds)."""
    part = paired[paired["member"] == member]
    subgroups = [s for s in SUBGROUPS if s in set(part["subgroup"])]
    rows = []
    for (metric, a, b), block in part.groupby(["metric", "a", "b"], sort=False):
        cells = [metric, f"{a} − {b}"]
        for s in subgroups:
            row = block[block["subgroup"] == s]
            if row.empty:
                cells.append("–")
                continue
            row = row.iloc[0]
            if seeds:
                cells.append(f"{_signed(row['seed_difference'])} [{_signed(row['seed_low'])}, "
                             f"{_signed(row['seed_high'])}] {row['seeds_better']}/{row['seeds']}")
            else:
                cells.append(f"{_signed(row['difference'])} [{_signed(row['low'])}, {_signed(row['high'])}]")
        rows.append(cells)
    return markdown_table(["metric", "difference", *subgroups], rows)


def _design_line(records: list[dict], member: str, spec: dict) -> str:
    runs = [r for r in records if r.get("member") == member and r.get("kind") == "run"]
    if not runs:
        notes = [r["note"] for r in records if r.get("member") == member and r.get("kind") == "note"]
        return f"{member}: not run ({'; '.join(notes) or 'no records'})."
    design = ", ".join(f"{k} {v}" for k, v in spec.items() if k != "kind")
    cells = int(np.median([r["n_cells"] for r in runs]))
    genes = int(np.median([r["n_genes"] for r in runs]))
    wall = [r["value"] for r in runs]
    return (f"{member} ({spec['kind']}; {design}): {len(runs)} seed(s), median {cells} cells × {genes} genes, "
            f"{int(np.median([r['n_test'] for r in runs]))} held-out perturbations per seed; wall time per seed "
            f"{_fmt(float(np.median(wall)))} s (median; {_fmt(min(wall))}–{_fmt(max(wall))}), "
            f"{_fmt(sum(wall) / 60)} min in all; target value {runs[0]['target_value']}.")


def _report(records: list[dict], designs: dict, members: list[str], quick: bool, notes: list[str]) -> str:
    means, paired = seed_means(records), paired_comparisons(records)
    lines = ["# Perturbation prediction on data with a known DAG" + (" (quick)" if quick else ""), "",
             "Per seed the mean over the held-out perturbations of a subgroup; tables: the median over seeds "
             "(min … max), with the perturbations pooled over seeds in the header. Differences: a − b on the same "
             "perturbations; for the MSE below 0 favours a, for the correlation above 0. Pooled: percentile "
             f"bootstrap over the perturbations of every seed ({BOOTSTRAP} resamples, 95 %); over seeds: Student-t "
             "interval of the per-seed mean differences, and the seeds favouring a.", ""]
    lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    lines += [f"- {_design_line(records, m, designs[m])}" for m in members] + [""]
    for member in members:
        if means.empty or member not in set(means["member"]):
            continue
        lines += [f"## {member}", ""]
        for metric, label in METRIC_LABELS.items():
            if metric in set(means[means["member"] == member]["metric"]):
                lines += [f"{label}:", "", _median_table(means, member, metric), ""]
        if not paired.empty and member in set(paired["member"]):
            lines += ["Paired differences, pooled over perturbations:", "", _paired_table(paired, member, False), "",
                      "Over seeds:", "", _paired_table(paired, member, True), ""]
    return "\n".join(lines)


def _figure(records: list[dict]):
    """Per metric (rows) and member (columns): each comparison's pooled difference and interval per subgroup."""
    paired = paired_comparisons(records)
    members = list(dict.fromkeys(paired["member"])) if not paired.empty else []
    metrics = [m for m in METRICS if not paired.empty and m in set(paired["metric"])]
    fig, axes = plt.subplots(max(1, len(metrics)), max(1, len(members)), squeeze=False,
                             figsize=(3.2 * max(1, len(members)), 3.0 * max(1, len(metrics))))
    colours = plt.get_cmap("tab10")
    for i, metric in enumerate(metrics):
        for j, member in enumerate(members):
            ax = axes[i, j]
            part = paired[(paired["member"] == member) & (paired["metric"] == metric)]
            subgroups = [s for s in SUBGROUPS if s in set(part["subgroup"])]
            for k, (a, b) in enumerate(COMPARISONS):
                rows = part[(part["a"] == a) & (part["b"] == b)].set_index("subgroup").reindex(subgroups)
                y = np.arange(len(subgroups)) + (k - 1.5) * 0.18
                ax.errorbar(rows["difference"], y, xerr=[rows["difference"] - rows["low"],
                                                         rows["high"] - rows["difference"]],
                            fmt="o", ms=3, color=colours(k), label=f"{a} − {b}" if i == j == 0 else None)
            ax.axvline(0.0, color="0.5", lw=0.8)
            ax.set_yticks(range(len(subgroups)), subgroups, fontsize=7)  # members differ in their subgroups
            ax.set_title(f"{member}: {metric}", fontsize=8)
            ax.tick_params(axis="x", labelsize=7)
    if metrics and members:
        fig.legend(loc="lower center", ncol=2, fontsize=7, frameon=False, bbox_to_anchor=(0.5, -0.06))
    else:
        axes[0, 0].text(0.5, 0.5, "no paired scores", ha="center", va="center")
    fig.tight_layout()
    return fig
