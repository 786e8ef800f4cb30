"""``cape-bench intervention``: predictions of real interventions from observational cells (Sachs et al. 2005).

Step I is fitted on the observational cells only (cd3cd28 and cd3cd28+icam2, log1p, as
:func:`cape.data.sachs_interventions` makes them). For each perturbation condition whose target protein is
measured, every method predicts do(target = the target's mean in that condition) counterfactually on the
observational cells (and, as a second rule, do(target = a low or high level set by the reagent's documented
action, see :data:`VALUE_RULES`)), and the predicted mean shift of each protein is compared with the measured one
(condition mean − observational mean). Evaluated genes: the target's descendants in the consensus graph
(``varp["true_graph"]``, the same set for every method; conditions whose target has none are left out of
that set) and, as a second set, every other measured protein.

Methods: ``no_change`` (shift 0); for each Step I variant of :data:`CAPE_VARIANTS`, ``<variant>_learned``
(Step I's fitted equations on its DAG at the τ of ``cape.tl.causal_graph``'s automatic rule) and
``<variant>_linear`` (the same DAG, each protein refit on its parents by least squares), ``<variant>_class``
(IDA on the same DAG: least-squares effects averaged over the target's parent sets that its Markov
equivalence class allows, :mod:`cape.causal.equivalence`), and ``<variant>_*_tau0.05``: the same weighted graph
thresholded at 0.05 instead; ``consensus_linear`` and ``consensus_class`` (the consensus graph, the oracle,
the same two ways; its one cycle, plcg → PIP2 → PIP3 → plcg, is broken by :func:`~cape.causal.make_dag`
first); and each peer of ``cape-bench causal`` (gcastle, DAGMA; run in a subprocess on the same matrix) the
same two ways. Every variant is listed here and reported; none has a setting chosen on the test conditions (the
``_class`` rows were added after the single-DAG rows had missed on these conditions; IDA has no parameter).

Metrics per condition: ``mse`` of the predicted mean shift, ``sign_accuracy`` (share of genes whose
predicted shift has the measured sign; a zero prediction counts as wrong, so no change scores 0), and
``beats_no_change`` (MSE below no change's). Outputs under ``out``: ``intervention.json`` (records),
``intervention.md`` and ``intervention.png``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cape import data
from cape._errors import CapeInputError
from cape._io import save_figure, write_json, write_text
from cape.causal import (
    fit_parents_mlp,
    fit_variational_notears,
    intervene,
    learned_equations,
    linear_equations,
    make_dag,
)
from cape.causal.equivalence import intervene_equivalence_class
from cape.causal.postprocess import choose_tau
from cape.causal.structural_equations import descendants
from cape.data.perturbation_data import CONTROL, sachs_interventions
from cape.tasks.perturbation import condition_genes

from .peers import PEERS, run_peer

__all__ = ["QUICK", "SMALL_TAU", "run_intervention_benchmark", "shift_metrics"]

logger = logging.getLogger("cape")

#: The smaller threshold of the ``*_tau0.05`` variants (declared beforehand, not tuned).
SMALL_TAU = 0.05
QUICK = {"seeds": 1, "epochs": 30, "peers": ["notears"], "budget": 60.0, "variants": ["cape"]}
#: Step I variants (declared beforehand, all reported): the library defaults; ``cape_raw``: the unstandardised
#: matrix with the genes' own scales kept (as the ``*_raw`` methods of ``cape-bench causal``); ``cape_l01``: a
#: ten times weaker L1 penalty (λs = 0.1), for denser graphs; ``cape_parents_mlp``: Step I's nonlinear-parents model
#: (:mod:`cape.causal.parents_mlp`, its defaults).
CAPE_VARIANTS = {"cape": {}, "cape_raw": {"standardize": "none", "feature_norm": "data"},
                 "cape_l01": {"lambda_sparse": 0.1}, "cape_parents_mlp": {"model": "parents_mlp"}}
EVAL_SETS = ("descendants", "all_other")
#: How the value v of do(target = v) is chosen. ``measured``: the target's mean in the perturbed condition.
#: ``activity``: most of Sachs' reagents act on a protein's activity, not on the measured phospho-level (U0126
#: inhibits MEK's kinase activity while phospho-MEK rises), so the reagent's known action sets the value
#: instead: an inhibitor sets the target to its 1st percentile in the observational cells, an activator to its
#: 99th. The actions are the reagents' documented ones (Sachs et al. 2005, Table 1), not fitted to any outcome.
VALUE_RULES = ("measured", "activity")
REAGENT_ACTION = {"cd3cd28+aktinhib": -1, "cd3cd28+g0076": -1, "cd3cd28+psitect": -1, "cd3cd28+u0126": -1,
                  "cd3cd28+ly": -1, "pma": +1, "b2camp": +1}


def shift_metrics(predicted: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """MSE of predicted against measured mean shifts, and the share of genes with the right sign (0 is wrong)."""
    predicted, true = np.asarray(predicted, dtype=float), np.asarray(true, dtype=float)
    return {"mse": float(np.mean((predicted - true) ** 2)),
            "sign_accuracy": float(np.mean(np.sign(predicted) == np.sign(true)) if predicted.size else np.nan)}


def _graphs_from_cape(X: np.ndarray, seed: int, epochs: int, variant: str = "cape"
                      ) -> dict[str, tuple[str, np.ndarray, object]]:
    """Step I (one of :data:`CAPE_VARIANTS`) on X: method name → (equations kind, DAG, fit)."""
    options = dict(CAPE_VARIANTS[variant])
    if options.pop("model", None) == "parents_mlp":  # steps, not epochs: ``epochs`` does not apply
        fit = fit_parents_mlp(X, seed=seed, device="cpu", progress_desc=f"Step I ({variant})", **options)
    else:
        fit = fit_variational_notears(X.astype(np.float32), rank=None, epochs=epochs, seed=seed, device="cpu",
                                      progress_desc=f"Step I ({variant})", **options)
    tau, rule = choose_tau(fit.adjacency, "auto", 0.5)
    out = {}
    for suffix, t in (("", tau), (f"_tau{SMALL_TAU:g}", SMALL_TAU)):
        dag, _ = make_dag(fit.adjacency, t)
        logger.info("Step I %s seed %d at tau %.3g (%s): %d edges", variant, seed, t,
                    rule if not suffix else "fixed", int((dag != 0).sum()))
        out[f"{variant}_learned{suffix}"] = ("learned", dag, fit)
        out[f"{variant}_linear{suffix}"] = ("linear", dag, fit)
        out[f"{variant}_class{suffix}"] = ("class", dag, fit)
    return out


def run_intervention_benchmark(out: str | Path = "results/bench", *, quick: bool = False, seeds: int | None = None,
                               peers: list[str] | None = None, budget: float | None = None, epochs: int = 100,
                               variants: list[str] | None = None, adata=None) -> list[dict]:
    """Run the Sachs intervention benchmark (module docstring) and write its json/md/png under ``out``.

    ``adata``: the Sachs data as ``cape.data.load("sachs2005")`` returns it (default: loaded); ``peers``: which
    of :data:`cape_benchmarks.peers.PEERS` to run (default all; quick: notears); ``seeds``: Step I seeds 0..n-1;
    ``variants``: which of :data:`CAPE_VARIANTS` (default all; quick: the defaults).
    """
    variants = list(variants or (QUICK["variants"] if quick else CAPE_VARIANTS))
    if any(v not in CAPE_VARIANTS for v in variants):
        raise CapeInputError(f"unknown Step I variant(s); known: {', '.join(CAPE_VARIANTS)}")
    n_seeds = seeds or (QUICK["seeds"] if quick else 3)
    epochs = QUICK["epochs"] if quick else epochs
    peers = list(QUICK["peers"] if quick and peers is None else (peers if peers is not None else PEERS))
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise CapeInputError(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    budget = budget or (QUICK["budget"] if quick else 600.0)
    sachs = sachs_interventions(adata if adata is not None else data.load("sachs2005"))
    genes = [str(g) for g in sachs.var_names]
    labels = sachs.obs["condition"].astype(str).to_numpy()
    X = np.asarray(sachs.X[labels == CONTROL], dtype=np.float64)
    consensus = np.asarray(sachs.varp["true_graph"].toarray() != 0, dtype=float)
    conditions = [c for c in dict.fromkeys(labels) if c != CONTROL]
    control_mean = X.mean(0)
    targets = {c: genes.index(condition_genes(c)[0]) for c in conditions}
    true_shift = {c: np.asarray(sachs.X[labels == c], dtype=np.float64).mean(0) - control_mean for c in conditions}
    measured = {c: float(np.asarray(sachs.X[labels == c], dtype=np.float64)[:, targets[c]].mean()) for c in conditions}
    reagent = {c: str(sachs.obs["sachs_condition"][labels == c].iloc[0]) for c in conditions}
    activity = {c: float(np.percentile(X[:, targets[c]], 1 if REAGENT_ACTION.get(reagent[c], -1) < 0 else 99))
                for c in conditions}
    values = {"measured": measured, "activity": activity}
    src, dst = np.nonzero(consensus)
    eval_genes = {c: {"descendants": np.flatnonzero(descendants(len(genes), src, dst, [targets[c]])),
                      "all_other": np.array([i for i in range(len(genes)) if i != targets[c]])} for c in conditions}

    records: list[dict] = []

    def score(method: str, seed: int | None, eq, n_edges: int) -> None:
        """``eq``: structural equations, a DAG (an array: IDA over its equivalence class) or None (no change)."""
        for rule, c in ((r, c) for r in VALUE_RULES for c in conditions):
            if eq is None:
                shift = np.zeros(len(genes))
            elif isinstance(eq, np.ndarray):
                predicted, _, _, _ = intervene_equivalence_class(X, eq, targets[c], values[rule][c])
                shift = predicted.mean(0) - control_mean
            else:
                predicted, _ = intervene(eq, X, {targets[c]: values[rule][c]}, mode="counterfactual")
                shift = predicted.mean(0) - control_mean
            for subset, idx in eval_genes[c].items():
                if not idx.size:
                    continue
                m = shift_metrics(shift[idx], true_shift[c][idx])
                records.extend({"method": method, "seed": seed, "value_rule": rule, "condition": c,
                                "target": genes[targets[c]], "genes": subset, "n_genes": int(idx.size),
                                "n_edges": n_edges, "metric": k, "value": v} for k, v in m.items())

    score("no_change", None, None, 0)
    # The consensus graph holds one cycle (plcg → PIP2 → PIP3 → plcg); a refit needs a DAG, so make_dag drops the
    # edge that closes it in index order (PIP3 → plcg), reported in the markdown. Descendants stay the consensus's.
    consensus_dag, _ = make_dag(consensus, 0.0)
    dropped = [f"{genes[i]} → {genes[j]}" for i, j in zip(*np.nonzero((consensus != 0) & (consensus_dag == 0)),
                                                         strict=True)]
    score("consensus_linear", None, linear_equations(X, consensus_dag), int((consensus_dag != 0).sum()))
    score("consensus_class", None, consensus_dag, int((consensus_dag != 0).sum()))
    for seed, variant in ((s, v) for v in variants for s in range(n_seeds)):
        for method, (kind, dag, fit) in _graphs_from_cape(X, seed, epochs, variant).items():
            if kind == "learned":
                eq = learned_equations(fit.model, fit.mean, fit.std, X, dag)
            else:
                eq = linear_equations(X, dag) if kind == "linear" else dag
            score(method, seed, eq, int((dag != 0).sum()))
    for peer in peers:
        result = run_peer(peer, X, budget=budget, seed=0)
        if result.status != "ok":
            logger.warning("peer %s: %s (%s); left out", peer, result.status, result.message)
            continue
        try:
            graph, _ = make_dag(np.asarray(result.adjacency), 0.0)  # a peer's thresholded graph may hold a cycle
            score(f"{peer}_linear", 0, linear_equations(X, graph), int((graph != 0).sum()))
            score(f"{peer}_class", 0, graph, int((graph != 0).sum()))
        except ValueError as err:
            logger.warning("peer %s: %s; left out", peer, err)
    _add_beats(records)
    out = Path(out)
    write_json(records, out / "intervention.json")
    write_text(_markdown(records, n_seeds, quick, values, genes, targets, dropped), out / "intervention.md")
    save_figure(_figure(records), out / "intervention.png")
    return records


def _add_beats(records: list[dict]) -> None:
    """``beats_no_change`` per method, seed, condition and gene set: 1 when its MSE is below no change's by more
    than round-off (a method that predicts no shift for a condition ties with no change; it does not beat it)."""
    base = {(r["value_rule"], r["condition"], r["genes"]): r["value"] for r in records
            if r["method"] == "no_change" and r["metric"] == "mse"}
    extra = [{**r, "metric": "beats_no_change",
              "value": float(r["value"] < base[(r["value_rule"], r["condition"], r["genes"])] * (1 - 1e-9))}
             for r in records if r["metric"] == "mse" and r["method"] != "no_change"]
    records.extend(extra)


def summary_table(records: list[dict], genes: str = "descendants", values: str = "measured") -> pd.DataFrame:
    """Per method: conditions won against no change (per seed; mean over seeds), mean MSE and sign accuracy, edges."""
    frame = pd.DataFrame([r for r in records if r["genes"] == genes and r["value_rule"] == values])
    per = frame.groupby(["method", "condition", "metric"], sort=False)["value"].mean().unstack("metric")
    rows = []
    for method in dict.fromkeys(frame["method"]):
        sub = per.xs(method, level="method")
        own = frame[(frame["method"] == method)]
        beats = own[own["metric"] == "beats_no_change"]
        won = beats.groupby(beats["seed"].fillna(-1))["value"].sum().mean() if len(beats) else 0.0
        rows.append({"method": method, "beats no change": f"{won:.3g}/{len(sub)}", "mean MSE": sub["mse"].mean(),
                     "mean sign accuracy": sub["sign_accuracy"].mean(), "edges": own["n_edges"].mean()})
    return pd.DataFrame(rows)


def _markdown(records, n_seeds, quick, values, genes, targets, dropped) -> str:
    lines = [f"# Intervention prediction on Sachs 2005{' (quick)' if quick else ''}", "",
             "Step I fitted on the observational cells (cd3cd28, cd3cd28+icam2; log1p); each method predicts "
             "do(target = its mean in the condition) counterfactually on those cells. Step I seeds "
             f"0–{n_seeds - 1} (cape rows: mean over seeds); peers seed 0.", "",
             "Intervention values (log1p), rule `measured` (the target's mean in the condition): "
             + ", ".join(f"{c} → {genes[targets[c]]} = {v:.3g}" for c, v in values["measured"].items()) + "; rule "
             "`activity` (the reagent's documented action: inhibitor → the target's 1st percentile in the "
             "observational cells, activator → its 99th): "
             + ", ".join(f"{c} → {v:.3g}" for c, v in values["activity"].items()), "",
             "consensus_linear refits the consensus graph without "
             + (", ".join(dropped) or "no edge") + " (the edge closing its one cycle).", ""]
    sets = (("descendants", "the target's descendants in the consensus graph"),
            ("all_other", "every other measured protein"))
    for rule, (subset, title) in ((r, s) for r in VALUE_RULES for s in sets):
        table = summary_table(records, subset, rule)
        lines += [f"## Values `{rule}`; genes: {title}", "",
                  "| method | beats no change | mean MSE | mean sign accuracy | edges |", "|---|---|---|---|---|"]
        lines += [f"| {r['method']} | {r['beats no change']} | {r['mean MSE']:.4f} | {r['mean sign accuracy']:.3f} | "
                  f"{r['edges']:.1f} |" for r in table.to_dict("records")]
        frame = pd.DataFrame([r for r in records if r["genes"] == subset and r["value_rule"] == rule
                              and r["metric"] in ("mse", "sign_accuracy")])
        per = frame.groupby(["condition", "method", "metric"], sort=False)["value"].mean().unstack("metric")
        lines += ["", "beats no change: conditions with an MSE below no change's, per seed, mean over seeds.",
                  "", "Per condition (MSE / sign accuracy):", "", "| condition | method | MSE | sign accuracy |",
                  "|---|---|---|---|"]
        lines += [f"| {c} | {m} | {row['mse']:.4f} | {row['sign_accuracy']:.3f} |" for (c, m), row in per.iterrows()]
        lines.append("")
    return "\n".join(lines) + "\n"


def _figure(records: list[dict]):
    matplotlib.use("Agg")
    fig, axes = plt.subplots(len(VALUE_RULES), 1, figsize=(12, 3.6 * len(VALUE_RULES)), squeeze=False)
    for ax, rule in zip(axes[:, 0], VALUE_RULES, strict=True):
        frame = pd.DataFrame([r for r in records if r["genes"] == "descendants" and r["metric"] == "mse"
                              and r["value_rule"] == rule])
        per = frame.groupby(["condition", "method"], sort=False)["value"].mean().unstack("method")
        methods = list(per.columns)
        width = 0.8 / max(1, len(methods))
        colors = plt.get_cmap("tab20")
        for i, m in enumerate(methods):
            ax.bar(np.arange(len(per.index)) + i * width, per[m].to_numpy(), width, label=m, color=colors(i % 20))
        ax.set_xticks(np.arange(len(per.index)) + 0.4 - width / 2, per.index, fontsize=7)
        ax.set_ylabel("MSE of descendants' mean shift")
        ax.set_title(f"Sachs 2005, values '{rule}': predicted vs measured intervention effects (lower is better)",
                     fontsize=9)
        ax.legend(fontsize=6, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig
