"""``cape bench intervention``: predictions of real interventions from observational cells (Sachs et al. 2005).

Step I is fitted on the observational cells only (cd3cd28 and cd3cd28+icam2, log1p, as
:func:`cape.data.sachs_interventions` makes them). For each perturbation condition whose target protein is
measured, every method predicts do(target = the target's mean in that condition) counterfactually on the
observational cells, and the predicted mean shift of each protein is compared with the measured one
(condition mean − observational mean). Evaluated genes: the target's descendants in the consensus graph
(``varp["true_graph"]``, the same set for every method; conditions whose target has none are left out of
that set) and, as a second set, every other measured protein.

Methods: ``no_change`` (shift 0); for each Step I variant of :data:`CAPE_VARIANTS`, ``<variant>_learned``
(Step I's fitted equations on its DAG at the τ of ``cape.tl.causal_graph``'s automatic rule) and
``<variant>_linear`` (the same DAG, each protein refit on its parents by least squares), and
``<variant>_*_tau0.05``: the same weighted graph thresholded at 0.05 instead; ``consensus_linear`` (the
consensus graph refit the same way: the oracle graph; its one cycle, plcg → PIP2 → PIP3 → plcg, is broken by
:func:`~cape.causal.make_dag` first); and each peer of ``cape bench causal`` (gcastle, DAGMA; run in a
subprocess on the same matrix) refit the same way.
Every variant is listed here beforehand and reported; nothing is chosen on the test conditions.

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

from .. import data
from .._errors import CapeInputError
from .._io import save_figure, write_json, write_text
from ..causal import fit_variational_notears, intervene, learned_equations, linear_equations, make_dag
from ..causal.intervention import descendants
from ..causal.postprocess import choose_tau
from ..data.perturbation import CONTROL, sachs_interventions
from ..tasks.perturbation import condition_genes
from .peers import PEERS, run_peer

__all__ = ["QUICK", "SMALL_TAU", "run_intervention_benchmark", "shift_metrics"]

logger = logging.getLogger("cape")

#: The smaller threshold of the ``*_tau0.05`` variants (declared beforehand, not tuned).
SMALL_TAU = 0.05
QUICK = {"seeds": 1, "epochs": 30, "peers": ["notears"], "budget": 60.0, "variants": ["cape"]}
#: Step I variants (declared beforehand, all reported): the library defaults; ``cape_raw``: the unstandardised
#: matrix with the genes' own scales kept (as the ``*_raw`` methods of ``cape bench causal``); ``cape_l01``: a
#: ten times weaker L1 penalty (λs = 0.1), for denser graphs.
CAPE_VARIANTS = {"cape": {}, "cape_raw": {"standardize": "none", "feature_norm": "data"},
                 "cape_l01": {"lambda_sparse": 0.1}}
EVAL_SETS = ("descendants", "all_other")


def shift_metrics(predicted: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """MSE of predicted against measured mean shifts, and the share of genes with the right sign (0 is wrong)."""
    predicted, true = np.asarray(predicted, dtype=float), np.asarray(true, dtype=float)
    return {"mse": float(np.mean((predicted - true) ** 2)),
            "sign_accuracy": float(np.mean(np.sign(predicted) == np.sign(true)) if predicted.size else np.nan)}


def _graphs_from_cape(X: np.ndarray, seed: int, epochs: int, variant: str = "cape"
                      ) -> dict[str, tuple[str, np.ndarray, object]]:
    """Step I (one of :data:`CAPE_VARIANTS`) on X: method name → (equations kind, DAG, fit)."""
    fit = fit_variational_notears(X.astype(np.float32), rank=None, epochs=epochs, seed=seed, device="cpu",
                                  progress_desc=f"Step I ({variant})", **CAPE_VARIANTS[variant])
    tau, rule = choose_tau(fit.adjacency, "auto", 0.5)
    out = {}
    for suffix, t in (("", tau), (f"_tau{SMALL_TAU:g}", SMALL_TAU)):
        dag, _ = make_dag(fit.adjacency, t)
        logger.info("Step I %s seed %d at tau %.3g (%s): %d edges", variant, seed, t,
                    rule if not suffix else "fixed", int((dag != 0).sum()))
        out[f"{variant}_learned{suffix}"] = ("learned", dag, fit)
        out[f"{variant}_linear{suffix}"] = ("linear", dag, fit)
    return out


def run_intervention_benchmark(out: str | Path = "results/bench", *, quick: bool = False, seeds: int | None = None,
                               peers: list[str] | None = None, budget: float | None = None, epochs: int = 100,
                               variants: list[str] | None = None, adata=None) -> list[dict]:
    """Run the Sachs intervention benchmark (module docstring) and write its json/md/png under ``out``.

    ``adata``: the Sachs data as ``cape.data.load("sachs2005")`` returns it (default: loaded); ``peers``: which
    of :data:`cape.bench.peers.PEERS` to run (default all; quick: notears); ``seeds``: Step I seeds 0..n-1;
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
    value = {c: float(np.asarray(sachs.X[labels == c], dtype=np.float64)[:, targets[c]].mean()) for c in conditions}
    src, dst = np.nonzero(consensus)
    eval_genes = {c: {"descendants": np.flatnonzero(descendants(len(genes), src, dst, [targets[c]])),
                      "all_other": np.array([i for i in range(len(genes)) if i != targets[c]])} for c in conditions}

    records: list[dict] = []

    def score(method: str, seed: int | None, eq, n_edges: int) -> None:
        for c in conditions:
            if eq is None:
                shift = np.zeros(len(genes))
            else:
                predicted, _ = intervene(eq, X, {targets[c]: value[c]}, mode="counterfactual")
                shift = predicted.mean(0) - control_mean
            for subset, idx in eval_genes[c].items():
                if not idx.size:
                    continue
                m = shift_metrics(shift[idx], true_shift[c][idx])
                records.extend({"method": method, "seed": seed, "condition": c, "target": genes[targets[c]],
                                "genes": subset, "n_genes": int(idx.size), "n_edges": n_edges, "metric": k,
                                "value": v} for k, v in m.items())

    score("no_change", None, None, 0)
    # The consensus graph holds one cycle (plcg → PIP2 → PIP3 → plcg); a refit needs a DAG, so make_dag drops the
    # edge that closes it in index order (PIP3 → plcg), reported in the markdown. Descendants stay the consensus's.
    consensus_dag, _ = make_dag(consensus, 0.0)
    dropped = [f"{genes[i]} → {genes[j]}" for i, j in zip(*np.nonzero((consensus != 0) & (consensus_dag == 0)),
                                                         strict=True)]
    score("consensus_linear", None, linear_equations(X, consensus_dag), int((consensus_dag != 0).sum()))
    for seed, variant in ((s, v) for v in variants for s in range(n_seeds)):
        for method, (kind, dag, fit) in _graphs_from_cape(X, seed, epochs, variant).items():
            eq = (learned_equations(fit.model, fit.mean, fit.std, X, dag) if kind == "learned"
                  else linear_equations(X, dag))
            score(method, seed, eq, int((dag != 0).sum()))
    for peer in peers:
        result = run_peer(peer, X, budget=budget, seed=0)
        if result.status != "ok":
            logger.warning("peer %s: %s (%s); left out", peer, result.status, result.message)
            continue
        try:
            graph, _ = make_dag(np.asarray(result.adjacency), 0.0)  # a peer's thresholded graph may hold a cycle
            score(f"{peer}_linear", 0, linear_equations(X, graph), int((graph != 0).sum()))
        except ValueError as err:
            logger.warning("peer %s: %s; left out", peer, err)
    _add_beats(records)
    out = Path(out)
    write_json(records, out / "intervention.json")
    write_text(_markdown(records, n_seeds, quick, value, genes, targets, dropped), out / "intervention.md")
    save_figure(_figure(records), out / "intervention.png")
    return records


def _add_beats(records: list[dict]) -> None:
    """``beats_no_change`` per method, seed, condition and gene set (1 when its MSE is below no change's)."""
    base = {(r["condition"], r["genes"]): r["value"] for r in records
            if r["method"] == "no_change" and r["metric"] == "mse"}
    extra = [{**r, "metric": "beats_no_change", "value": float(r["value"] < base[(r["condition"], r["genes"])])}
             for r in records if r["metric"] == "mse" and r["method"] != "no_change"]
    records.extend(extra)


def summary_table(records: list[dict], genes: str = "descendants") -> pd.DataFrame:
    """Per method: conditions won against no change (seed-mean MSE below it), mean MSE and sign accuracy, edges."""
    frame = pd.DataFrame([r for r in records if r["genes"] == genes])
    per = frame.groupby(["method", "condition", "metric"], sort=False)["value"].mean().unstack("metric")
    base = per.xs("no_change", level="method")["mse"]
    rows = []
    for method in dict.fromkeys(frame["method"]):
        sub = per.xs(method, level="method")
        won = int((sub["mse"] < base.reindex(sub.index)).sum())
        edges = frame[(frame["method"] == method)]["n_edges"].mean()
        rows.append({"method": method, "beats no change": f"{won}/{len(sub)}", "mean MSE": sub["mse"].mean(),
                     "mean sign accuracy": sub["sign_accuracy"].mean(), "edges": edges})
    return pd.DataFrame(rows)


def _markdown(records, n_seeds, quick, value, genes, targets, dropped) -> str:
    lines = [f"# Intervention prediction on Sachs 2005{' (quick)' if quick else ''}", "",
             "Step I fitted on the observational cells (cd3cd28, cd3cd28+icam2; log1p); each method predicts "
             "do(target = its mean in the condition) counterfactually on those cells. Step I seeds "
             f"0–{n_seeds - 1} (cape rows: mean over seeds); peers seed 0.", "",
             "Intervention values (log1p): " + ", ".join(f"{c} → {genes[targets[c]]} = {v:.3g}"
                                                         for c, v in value.items()), "",
             "consensus_linear refits the consensus graph without "
             + (", ".join(dropped) or "no edge") + " (the edge closing its one cycle).", ""]
    for subset, title in (("descendants", "Genes: the target's descendants in the consensus graph"),
                          ("all_other", "Genes: every other measured protein")):
        table = summary_table(records, subset)
        lines += [f"## {title}", "", "| method | beats no change | mean MSE | mean sign accuracy | edges |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['method']} | {r['beats no change']} | {r['mean MSE']:.4f} | {r['mean sign accuracy']:.3f} | "
                  f"{r['edges']:.1f} |" for r in table.to_dict("records")]
        frame = pd.DataFrame([r for r in records if r["genes"] == subset and r["metric"] in ("mse", "sign_accuracy")])
        per = frame.groupby(["condition", "method", "metric"], sort=False)["value"].mean().unstack("metric")
        lines += ["", "Per condition (MSE / sign accuracy):", "", "| condition | method | MSE | sign accuracy |",
                  "|---|---|---|---|"]
        lines += [f"| {c} | {m} | {row['mse']:.4f} | {row['sign_accuracy']:.3f} |" for (c, m), row in per.iterrows()]
        lines.append("")
    return "\n".join(lines) + "\n"


def _figure(records: list[dict]):
    matplotlib.use("Agg")
    frame = pd.DataFrame([r for r in records if r["genes"] == "descendants" and r["metric"] == "mse"])
    per = frame.groupby(["condition", "method"], sort=False)["value"].mean().unstack("method")
    methods = list(per.columns)
    fig, ax = plt.subplots(figsize=(2 + 0.9 * len(per.index) * max(1, len(methods)) / 4, 3.8))
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        ax.bar(np.arange(len(per.index)) + i * width, per[m].to_numpy(), width, label=m)
    ax.set_xticks(np.arange(len(per.index)) + 0.4 - width / 2, per.index, rotation=20, fontsize=7)
    ax.set_ylabel("MSE of descendants' mean shift")
    ax.set_title("Sachs 2005: predicted vs measured intervention effects (lower is better)")
    ax.legend(fontsize=6, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig
