"""``cape-bench causal --panel counts``: Step I on count simulators that were not designed around it (issue 54).

Members (each seed draws a new network, new kinetics and new cells, except ``bn_counts``, whose network is fixed):

- ``sergio``: SERGIO (Dibaeinia & Sinha 2020, ``sergio-scsim`` 1.9.3 in its own environment, :mod:`.sergio`) on a
  random DAG: Hill regulation (n = 2, |K| uniform in [1, 5] × strength), master regulators low or high per cell type,
  steady-state cells, then SERGIO's own technical noise (outlier genes, library size, dropout, Poisson UMIs). The
  base and the sweeps use the 10x-like noise of the paper's DS2 data with the library-size mean set to log(depth);
  ``sergio_ds1``..``sergio_ds3`` use the paper's DS1–DS3 noise as it is (:data:`SERGIO_NOISE`).
- ``boolode``: BoolODE's Hill-kinetics SDE (Pratapa et al. 2020), implemented from its equations
  (:mod:`.boolode`), NB counts around each cell's expression share times its library size.
- ``bn_counts``: bnlearn's linear Gaussian network arth150 (107 genes, 150 arcs, :mod:`cape.data.gaussian_bn`;
  ecoli70, 46 genes / 70 arcs, when fewer than 100 genes are asked for, as in ``--quick``),
  cell types as shifted intercepts of five programme genes per type, each gene standardised, then NB counts with
  mean ``exp(0.5·z + a_gene) / Σ · library``; regulation strength scales every coefficient.
- ``grn_cells``: :func:`cape.data.simulate_grn_cells` (control cells only), the regulation strength as 1 / its
  structural noise.

Sweeps, one at a time around a base setting per member (3 cell types, 5,000 UMIs per cell, NB θ 3, strength 1):
cell types 1 and 8, depth 1,000 and 20,000, θ 1 and 20 (not SERGIO: its counts are Poisson), strength 0.5 and 2.
Every member's counts go through ``cape.pp.preprocess`` (normalise per cell, log1p, every gene kept); Step I runs
as :func:`cape.tl.causal_graph` runs it (:func:`cape.causal.learn_causal_graph` with
:class:`~cape.causal.CausalConfig`'s defaults); the peers see the same matrix.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import anndata as ad
import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy import stats
from sklearn.metrics import average_precision_score

from cape import data
from cape._errors import CapeInputError
from cape._io import save_figure, write_json, write_text
from cape._tables import markdown_table
from cape.causal import CausalConfig, learn_causal_graph
from cape.causal.postprocess import BUDGET_FDR
from cape.causal.structure_recovery import dag_metrics
from cape.data.gaussian_bn import read_gaussian_bn
from cape.data.grn_cells import CountNoise, simulate_grn_cells
from cape.data.perturbation_data import random_dag
from cape.pp import preprocess

from .boolode import simulate_boolode
from .causal import _budget, _run_undirected, _thresholded, _top_directed, _top_pairs, kept_edge_scores, skeleton_f1
from .peers import run_peer
from .sergio import simulate_sergio

__all__ = ["BASE", "ISSUE_FIGURES", "MEMBERS", "PANEL_METHODS", "SERGIO_NOISE", "figure_checks", "figures_report",
           "panel_settings", "run_count_panel", "simulate_member"]

logger = logging.getLogger("cape")

MEMBERS = ("sergio", "boolode", "bn_counts", "grn_cells")
#: The base setting of every member; each sweep changes one of these.
BASE = {"n_types": 3, "depth": 5000.0, "dispersion": 3.0, "strength": 1.0}
SWEEPS = {"n_types": {"types1": 1, "types8": 8}, "depth": {"depth1k": 1000.0, "depth20k": 20000.0},
          "dispersion": {"disp1": 1.0, "disp20": 20.0}, "strength": {"weak": 0.5, "strong": 2.0}}
#: SERGIO's technical noise (outlier probability, mean, scale; library-size mean, scale; dropout shape, percentile)
#: of the SERGIO paper's DS1, DS2 and DS3 data made to resemble 10x Chromium data, as transcribed from the paper's
#: supplementary tables by AVICI (Lorch et al. 2022, ``avici/synthetic/sergio/noise_config.yaml``, "10x-chromium").
SERGIO_NOISE = {"ds1": (0.01, 3.0, 1.0, 6.0, 0.3, 8.0, 74.0), "ds2": (0.01, 3.0, 1.0, 6.0, 0.4, 8.0, 82.0),
                "ds3": (0.01, 5.0, 1.0, 4.5, 0.7, 8.0, 45.0)}
FULL = {"n_cells": 3000, "n_genes": 120, "n_edges": 180, "seeds": 5, "budget": 600.0, "epochs": None}
QUICK = {"n_cells": 300, "n_genes": 20, "n_edges": 30, "seeds": 1, "budget": 60.0, "epochs": 5}
#: Methods: Step I with its defaults, and the peers (partial correlation at 5 % FDR and cut at the true count,
#: graphical lasso, GRNBoost2 and DAGMA-linear, as :mod:`.causal` runs them). DAGMA-linear is issue 31's setting for
#: log-normalised counts (``dagma_linear_counts``: z-scored genes, λ1 0.03, threshold 0.05); with the library's
#: defaults (``dagma_linear``, accepted by ``methods``) it keeps no edge on them (its 0.3 threshold is above every
#: weight at the scale of log-normalised counts; arth150 through counts, seeds 0–1).
PANEL_METHODS = ("cape_default", "partial_correlation", "partial_correlation_true", "graphical_lasso", "grnboost2",
                 "dagma_linear_counts")
EXTRA_METHODS = ("dagma_linear", "cape_state_budget")
#: Step I's options of each cape method (``cape_state_budget``: the edge budget counted within cell states).
CAPE_METHODS = {"cape_default": {}, "cape_state_budget": {"budget_test": "state"}}
METRICS = ("skeleton_f1", "f1", "skeleton_auprc", "auprc", "kept", "true_edges", "kept_precision",
           "confidence_auprc", "confidence_gap_closed", "ordered_confidence_auprc", "ordered_confidence_gap_closed",
           "seconds")


def panel_settings(members: tuple[str, ...] = MEMBERS) -> dict[str, dict]:
    """Every setting of the panel: ``<member>`` (its base) and one per sweep value, e.g. ``boolode_types8``."""
    out = {}
    for member in members:
        out[member] = {"member": member, **BASE}
        for key, values in SWEEPS.items():
            if member == "sergio" and key == "dispersion":
                continue  # SERGIO's UMIs are Poisson: no dispersion to sweep
            out.update({f"{member}_{name}": {"member": member, **BASE, key: value} for name, value in values.items()})
        if member == "sergio":
            out.update({f"sergio_{ds}": {"member": member, **BASE, "noise": ds} for ds in SERGIO_NOISE})
    return out


def _nb_counts(expression: np.ndarray, depth: float, dispersion: float, rng: np.random.Generator) -> np.ndarray:
    """NB counts around each cell's expression share times a log-normal library size (median ``depth``, σ 0.4)."""
    library = rng.lognormal(np.log(depth), 0.4, expression.shape[0])
    mu = expression / expression.sum(1, keepdims=True) * library[:, None]
    return rng.negative_binomial(dispersion, dispersion / (dispersion + mu)).astype(np.int64)


def _bn_counts(spec: dict, seed: int, n_cells: int, n_genes: int) -> tuple[np.ndarray, np.ndarray]:
    """arth150 (ecoli70 when fewer than 100 genes are asked for) through the count model of the module docstring."""
    rng = np.random.default_rng(seed)
    name = "arth150" if n_genes >= 100 else "ecoli70"
    bn = read_gaussian_bn(data.fetch(name)["network"], name=name)
    bn = dataclasses.replace(bn, weights=bn.weights * spec["strength"])
    types = rng.integers(0, spec["n_types"], n_cells)
    z = np.zeros((n_cells, bn.n_genes))
    for t in range(spec["n_types"]):
        shifted = bn.intercepts.copy()
        if spec["n_types"] > 1:
            programme = rng.choice(bn.n_genes, 5, replace=False)
            shifted[programme] += 2.0 * np.sqrt(bn.variances[programme])
        z[types == t] = dataclasses.replace(bn, intercepts=shifted).sample(int((types == t).sum()), rng)
    z = (z - z.mean(0)) / z.std(0)
    abundance = rng.normal(0.0, 1.0, bn.n_genes)
    return _nb_counts(np.exp(0.5 * z + abundance), spec["depth"], spec["dispersion"], rng), bn.weights


def _sergio_counts(spec: dict, seed: int, n_cells: int, n_genes: int, n_edges: int):
    rng = np.random.default_rng(seed)
    W = random_dag(n_genes, n_edges, rng=rng)
    noise = SERGIO_NOISE[spec.get("noise", "ds2")]
    if "noise" not in spec:  # the base's 10x-like noise at the setting's depth
        noise = (*noise[:3], float(np.log(spec["depth"])), *noise[4:])
    counts, _, genes = simulate_sergio(W, n_types=spec["n_types"], cells_per_type=n_cells // spec["n_types"],
                                       seed=seed, noise=noise, k_range=(spec["strength"], 5.0 * spec["strength"]))
    return counts, W[np.ix_(genes, genes)], noise


def simulate_member(spec: dict, seed: int, n_cells: int, n_genes: int, n_edges: int) -> tuple[np.ndarray, np.ndarray,
                                                                                                dict]:
    """UMI counts (cells × genes, integers), the true DAG (``W[i, j] ≠ 0``: i → j) and the parameters used."""
    member, record = spec["member"], {k: v for k, v in spec.items() if k != "member"}
    if member == "sergio":
        counts, W, noise = _sergio_counts(spec, seed, n_cells, n_genes, n_edges)
        record["sergio_noise"] = list(noise)
        record.pop("dispersion")
    elif member == "boolode":
        counts, W, _ = simulate_boolode(seed, n_cells, n_genes, n_edges, spec["n_types"], spec["depth"],
                                        spec["dispersion"], spec["strength"])
    elif member == "bn_counts":
        counts, W = _bn_counts(spec, seed, n_cells, n_genes)
    elif member == "grn_cells":
        a = simulate_grn_cells(n_genes, n_edges, n_cells, spec["n_types"], 4, 0, 0, noise=1.0 / spec["strength"],
                               counts=CountNoise(depth=spec["depth"], dispersion=spec["dispersion"]), seed=seed)
        counts, W = np.asarray(a.layers["counts"].toarray()).astype(np.int64), a.varp["true_dag"].toarray()
    else:
        raise CapeInputError(f"unknown panel member {member!r}; known: {', '.join(MEMBERS)}")
    return counts, W, record


def log_normalised(counts: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``cape.pp.preprocess`` (normalise, log1p, every gene kept, cells with a count kept); constant genes dropped."""
    cells = ad.AnnData(counts.astype(np.float32))
    preprocess(cells, min_genes=1, n_top_genes=counts.shape[1])
    X = cells.X.toarray() if sp.issparse(cells.X) else np.asarray(cells.X)
    keep = np.flatnonzero(X.std(0) > 0)
    return X[:, keep].astype(np.float64), W[np.ix_(keep, keep)]


def skeleton_auprc(truth: np.ndarray, scores: np.ndarray) -> float:
    """Average precision of ranking every unordered pair by max(|s_ij|, |s_ji|) against the undirected true edges."""
    T, S = np.asarray(truth) != 0, np.abs(np.asarray(scores, dtype=float))
    upper = np.triu_indices(T.shape[0], 1)
    labels = (T | T.T)[upper]
    return float(average_precision_score(labels, np.maximum(S, S.T)[upper])) if labels.any() else float("nan")


def _run_method(method: str, X: np.ndarray, truth: np.ndarray, seed: int, budget: float,
                epochs: int | None) -> tuple[np.ndarray | None, np.ndarray | None, float, str, dict]:
    """One method on X: (graph, every pair's score or None, seconds, status, extra scores). For Step I the score is
    the ranking its graph was cut from (``CausalGraph.pair_scores``, else the fit's weights) on the direction its
    fit gives each pair, and
    ``extra["weights"]`` the fitted A."""
    start = time.perf_counter()
    if method in CAPE_METHODS:
        config = CausalConfig(**CAPE_METHODS[method], **({} if epochs is None else {"epochs": epochs}))
        genes = np.array([f"g{i}" for i in range(X.shape[1])])
        graph = learn_causal_graph(X.astype(np.float32), genes, config, device="cpu", seed=seed)
        extra = {**kept_edge_scores(truth, graph.dag, graph.confidence, graph.partial_correlation,
                                    graph.pair_partial_correlation),
                 "weights": graph.fit.adjacency}
        A = np.abs(graph.fit.adjacency)
        scores = np.maximum(A, A.T) if graph.pair_scores is None else graph.pair_scores
        return graph.dag, np.where(A >= A.T, scores, 0.0), time.perf_counter() - start, "ok", extra
    if method in ("partial_correlation", "partial_correlation_true", "graphical_lasso"):
        try:
            G, scores, seconds = _run_undirected(method.removesuffix("_true"), X, seed)
        except FloatingPointError as err:  # sklearn's graphical lasso on ill-conditioned data
            logger.warning("%s failed: %s", method, err)
            return None, None, time.perf_counter() - start, "failed", {}
        if method == "partial_correlation_true":  # its strongest pairs, as many as the true graph has
            G = _top_pairs(scores, int(np.count_nonzero(np.triu((truth != 0) | (truth != 0).T, 1))))
        return G, scores, seconds, "ok", {}
    result = run_peer(method, X, budget=budget, seed=seed, threads=1)
    if result.adjacency is None:
        return None, None, result.seconds, result.status, {}
    if method == "grnboost2":  # importances of every ordered pair; the graph: as many as cape's edge budget
        return (_top_directed(result.adjacency, _budget(X, BUDGET_FDR, seed) or 0), result.adjacency,
                result.seconds, "ok", {})
    return result.adjacency, result.adjacency, result.seconds, "ok", {}


def _scores(truth: np.ndarray, G: np.ndarray, ranking: np.ndarray | None) -> dict[str, float]:
    upper = np.triu((truth != 0) | (truth != 0).T, 1)
    kept = np.triu((G != 0) | (G != 0).T, 1)
    out = {"skeleton_f1": skeleton_f1(truth, G), "f1": dag_metrics(truth, G)["f1"],
           "kept": float(kept.sum()), "true_edges": float(upper.sum())}
    if ranking is not None:
        out |= {"skeleton_auprc": skeleton_auprc(truth, ranking), "auprc": dag_metrics(truth, ranking)["auprc"]}
    return out


def run_count_panel(out: str | Path = "results/bench", quick: bool = False, settings: list[str] | None = None,
                    methods: list[str] | None = None, n_seeds: int | None = None, seed_offset: int = 0,
                    budget: float | None = None, n_cells: int | None = None, n_genes: int | None = None,
                    taus: list[float | str] | None = None) -> list[dict]:
    """Run the panel; write ``count_panel.json``/``.md``/``.png`` under ``out``; returns the records.

    ``settings``: names from :func:`panel_settings` (default: every member's base; ``"all"``: every setting);
    ``methods``: from :data:`PANEL_METHODS` (default all; quick: Step I at 5 epochs and the in-process peers) and
    :data:`EXTRA_METHODS`; ``n_cells``/``n_genes``: the simulations' size (default 3,000 cells, 120 genes and 1.5
    edges per gene; quick: 300, 20); ``budget``: seconds per subprocess peer; ``taus``: thresholds
    (:func:`~cape_benchmarks.causal.parse_tau`, e.g. ``"budget0.05"`` or ``"fit-budget0.05"``) at which each Step I fit
    is also scored, as ``<method>@τ<tau>`` (the same fitted A cut as Step I's pipeline cuts it; their rows carry no
    ranking metrics).
    """
    size = dict(QUICK if quick else FULL)
    size.update({k: v for k, v in (("n_cells", n_cells), ("n_genes", n_genes)) if v is not None})
    if n_genes is not None:
        size["n_edges"] = int(1.5 * n_genes)
    known = panel_settings()
    settings = list(known) if settings == ["all"] else settings or list(MEMBERS)
    methods = methods or (["cape_default", "partial_correlation", "partial_correlation_true", "graphical_lasso"]
                          if quick else list(PANEL_METHODS))
    allowed = (*PANEL_METHODS, *EXTRA_METHODS)
    unknown = [s for s in settings if s not in known] + [m for m in methods if m not in allowed]
    if unknown:
        raise CapeInputError(f"unknown panel setting or method: {', '.join(unknown)}")
    n_seeds, budget = n_seeds or size["seeds"], budget or size["budget"]
    records: list[dict] = []
    for setting in settings:
        for seed in range(seed_offset, seed_offset + n_seeds):
            start = time.perf_counter()
            counts, W, params = simulate_member(known[setting], seed, size["n_cells"], size["n_genes"], size["n_edges"])
            X, truth = log_normalised(counts, W)
            base = {"setting": setting, "member": known[setting]["member"], "seed": seed, "n_cells": int(X.shape[0]),
                    "n_genes": int(X.shape[1]), "umis_per_cell": float(np.median(counts.sum(1))),
                    "zeros": float((counts == 0).mean()), "simulation_seconds": time.perf_counter() - start,
                    "params": params}
            for method in methods:
                G, ranking, seconds, status, extra = _run_method(method, X, truth, seed, budget, size["epochs"])
                weights = extra.pop("weights", None)
                scores = {"seconds": seconds, **(_scores(truth, G, ranking) if G is not None else {}), **extra}
                records.extend({**base, "method": method, "metric": k, "value": float(v), "status": status}
                               for k, v in scores.items())
                for tau in taus if weights is not None else []:
                    at = _thresholded(weights, X, tau, seed)
                    records.extend({**base, "method": f"{method}@τ{tau}", "metric": k, "value": float(v),
                                    "status": status} for k, v in _scores(truth, at, None).items())
                logger.info("%s seed %d %s: %s, %s", setting, seed, method, status,
                            ", ".join(f"{k} {v:.3g}" for k, v in scores.items()))
            write_json(records, Path(out) / "count_panel.json")  # so far: a long run stopped early keeps its records
    write_panel_outputs(records, out, quick, size)
    return records


def write_panel_outputs(records: list[dict], out: str | Path, quick: bool = False, size: dict | None = None) -> None:
    """Write ``count_panel.json``, ``.md`` (the tables), ``.png`` (the figure per setting) and ``_members.png`` (per
    member, over its settings and seeds) of ``records`` under ``out`` (also for records of several runs put
    together)."""
    out = Path(out)
    write_json(records, out / "count_panel.json")
    write_text(panel_report(records, quick, size or FULL), out / "count_panel.md")
    save_figure(panel_figure(records), out / "count_panel.png")
    save_figure(panel_figure(records, by="member"), out / "count_panel_members.png")


#: Issue 54's figures, checked per setting on the medians over its seeds: (name, Step I's metric, the peers whose
#: best median it is held against, the margin it may fall short by, the fixed bound where no peer is involved).
ISSUE_FIGURES = (
    ("kept ≤ 2 × true", "kept / true", (), 0.0, 2.0),
    ("skeleton F1 ≥ partial correlation 5 %", "skeleton_f1", ("partial_correlation",), 0.0, None),
    ("skeleton AUPRC ≥ best of partial correlation, GRNBoost2 − 0.02", "skeleton_auprc",
     ("partial_correlation", "grnboost2"), 0.02, None),
    ("directed F1 ≥ DAGMA-linear", "f1", ("dagma_linear_counts",), 0.0, None),
    ("confidence gap closed ≥ 0.5", "ordered_confidence_gap_closed", (), 0.0, 0.5),
)


#: Two-sided level of the interval over seeds on each figure's lead (Student's t on the paired per-seed leads).
LEAD_INTERVAL_LEVEL = 0.95


def _lead_interval(leads: np.ndarray) -> tuple[float, float, float]:
    """The mean of per-seed ``leads`` and its :data:`LEAD_INTERVAL_LEVEL` t-interval (NaN bounds from one seed)."""
    mean = float(np.mean(leads)) if leads.size else np.nan
    if leads.size < 2:
        return mean, np.nan, np.nan
    half = float(stats.t.ppf(0.5 + LEAD_INTERVAL_LEVEL / 2, leads.size - 1) * np.std(leads, ddof=1)
                 / np.sqrt(leads.size))
    return mean, mean - half, mean + half


def figure_checks(records: list[dict], method: str = "cape_default") -> pd.DataFrame:
    """Issue 54's figures (:data:`ISSUE_FIGURES`) for ``method`` in every setting it ran: one row per setting and
    figure with Step I's median (``value``), what it is held against (``against``: the best peer's median, or the
    fixed bound) and ``met`` (True / False; None where no peer of the figure ran in that setting). ``kept / true`` is
    the median over the seeds of each seed's kept pairs over its true pairs; every other value a median of the
    metric. The records of several runs may be put together (Step I from one, the peers from another).

    Beside the medians, each figure's ``lead`` per seed: Step I's value less the same seed's peer (the peer of the
    best median, less the figure's margin) or less the bound, the other way round for an upper bound, so that a
    positive lead is on the figure's side. ``lead`` is its mean over the seeds both ran (``seeds``), ``lead_low`` and
    ``lead_high`` its :data:`LEAD_INTERVAL_LEVEL` t-interval (NaN from one seed), and ``within_noise`` whether that
    interval holds 0: a figure met or missed by less than the seeds' spread (None without an interval)."""
    columns = ["setting", "figure", "value", "against", "met", "lead", "lead_low", "lead_high", "seeds",
               "within_noise"]
    frame = pd.DataFrame([r for r in records if r["status"] == "ok"])
    if frame.empty:
        return pd.DataFrame(columns=columns)
    keys = ["setting", "method", "seed"]
    ratio = (frame[frame["metric"] == "kept"].set_index(keys)["value"]
             / frame[frame["metric"] == "true_edges"].set_index(keys)["value"]).rename("value").reset_index()
    frame = pd.concat([frame, ratio.assign(metric="kept / true")])
    per_seed = frame.groupby(["setting", "method", "metric", "seed"])["value"].median()
    med = frame.groupby(["setting", "method", "metric"])["value"].median()
    rows = []
    for setting in dict.fromkeys(frame.loc[frame["method"] == method, "setting"]):
        for name, metric, peers, margin, bound in ISSUE_FIGURES:
            value = med.get((setting, method, metric), np.nan)
            ran = [p for p in peers if (setting, p, metric) in med]
            best = max(ran, key=lambda p: med[setting, p, metric]) if ran else None
            against = bound if not peers else (med[setting, best, metric] if best is not None else np.nan)
            known = np.isfinite(value) and np.isfinite(against)
            upper = metric == "kept / true"  # a bound from above; every other figure is one from below
            met = None if not known else bool(value <= against if upper else value >= against - margin)
            ours = per_seed[setting, method, metric] if (setting, method, metric) in med else pd.Series(dtype=float)
            theirs = (per_seed[setting, best, metric] - margin if best is not None
                      else pd.Series(bound if bound is not None else np.nan, index=ours.index))
            paired = pd.concat([ours, theirs], axis=1, join="inner").dropna().to_numpy()
            leads = (paired[:, 1] - paired[:, 0]) if upper else (paired[:, 0] - paired[:, 1])
            lead, low, high = _lead_interval(leads)
            rows.append({"setting": setting, "figure": name, "value": value, "against": against, "met": met,
                         "lead": lead, "lead_low": low, "lead_high": high, "seeds": int(leads.size),
                         "within_noise": None if not np.isfinite(low) else bool(low <= 0 <= high)})
    return pd.DataFrame(rows, columns=columns)


def figures_report(records: list[dict], method: str = "cape_default") -> str:
    """:func:`figure_checks` as a markdown table (one row per setting, Step I's median / what it is held against, in
    bold where the figure is missed, "–" where it could not be checked: no peer of it ran, or Step I has no value;
    "~" after a figure met or missed within the seeds' noise) and one line per figure: met in how many settings, and
    how many of the misses lie within the seeds' noise."""
    checks = figure_checks(records, method)
    if checks.empty:
        return ""
    names = [f[0] for f in ISSUE_FIGURES]
    cells = {}
    for row in checks.itertuples():
        text = "–" if row.met is None else f"{row.value:.3g} / {row.against:.3g}"
        text = f"**{text}**" if row.met is False else text
        cells[row.setting, row.figure] = text + (" ~" if row.met is not None and row.within_noise else "")
    settings = list(dict.fromkeys(checks["setting"]))
    table = markdown_table(["setting", *names], [[s, *(cells[s, n] for n in names)] for s in settings])
    summary = []
    for name in names:
        known = checks[(checks["figure"] == name) & checks["met"].notna()]
        unchecked = len(settings) - len(known)
        met = known["met"].astype(bool)
        noisy = known["within_noise"].map(lambda v: v is True)  # None: no interval
        summary.append(f"- {name}: met in {int(met.sum())} of {len(known)} settings"
                       + (f" ({unchecked} could not be checked)" if unchecked else "")
                       + (f"; within the seeds' noise: {int((noisy & met).sum())} of the {int(met.sum())} met, "
                          f"{int((noisy & ~met).sum())} of the {int((~met).sum())} missed" if len(known) else ""))
    level = f"{LEAD_INTERVAL_LEVEL:.0%}"
    return (f"## Against issue 54's figures ({method})\n\nMedian over each setting's seeds: {method}'s / what it "
            "is held against (the best peer's median, or the fixed bound); **bold**: missed; –: not checked "
            f"(no peer of that figure ran, or no value); ~: within the seeds' noise (the {level} t-interval of the "
            "per-seed lead over the peer or the bound, paired by seed, holds 0).\n\n" + table + "\n\n"
            + "\n".join(summary) + "\n")


TABLE_METRICS = ("skeleton_f1", "f1", "skeleton_auprc", "kept", "true_edges", "confidence_gap_closed",
                 "ordered_confidence_gap_closed", "seconds")


def _median_rows(frame: pd.DataFrame, key: str) -> list[list[str]]:
    wide = (frame[frame["metric"].isin(TABLE_METRICS)].groupby([key, "method", "metric"], sort=False)["value"]
            .median().unstack("metric").reindex(columns=list(TABLE_METRICS)))
    return [[str(k), str(m), *("–" if pd.isna(v) else f"{v:.3g}" for v in row)] for (k, m), row in wide.iterrows()]


def panel_report(records: list[dict], quick: bool, size: dict) -> str:
    """The report: the median per member (over its settings and seeds) and per setting, each method a row."""
    frame = pd.DataFrame(records)
    header = ["member", "method", *(f"median {m}" for m in TABLE_METRICS)]
    setting_header = ["setting", *header[1:]]
    failed = frame[(frame["status"] != "ok") & (frame["metric"] == "seconds")]
    notes = "".join(f"- {r.setting} seed {r.seed} {r.method}: {r.status} after {r.value:.0f} s\n"
                    for r in failed.itertuples())
    params = frame.drop_duplicates("setting").set_index("setting")["params"]
    seeds = ", ".join(f"{s}: {sorted(int(x) for x in g.unique())}"
                      for s, g in frame.groupby("setting", sort=False)["seed"])
    return (f"# Count-simulator panel{' (quick)' if quick else ''}\n\n"
            f"{size['n_cells']} cells, {size['n_genes']} genes ({size['n_edges']} true edges; bn_counts: its network); "
            f"seeds per setting: {seeds}. `kept`: gene pairs kept (either direction); "
            "`skeleton_auprc`: every unordered pair ranked by the method's score; `confidence_gap_closed`: (AUPRC "
            "of Step I's edge confidence among its kept edges − their precision) / (1 − their precision); "
            "`ordered_confidence_gap_closed`: the same for the confidence's ties broken by the size of the partial "
            "correlation (`cape.causal.edge_order`).\n\n"
            "## Median per member\n\n" + markdown_table(header, _median_rows(frame, "member")) +
            "\n\n## Median per setting\n\n" + markdown_table(setting_header, _median_rows(frame, "setting")) +
            ("\n\n" + figures_report(records) if "cape_default" in set(frame["method"]) else "") +
            "\n\n## Settings\n\n" + "\n".join(f"- `{s}`: {p}" for s, p in params.items()) + "\n"
            + ("\n## Runs without a result\n\n" + notes if notes else ""))


#: Step I's rows in reds (its default first, then the same fits cut otherwise, ``cape_default@τ…``), the peers not.
CAPE_COLORS = ("tab:red", "lightcoral", "darkred", "salmon")
PEER_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:gray", "tab:olive")


def _method_colors(methods: list[str]) -> dict[str, str]:
    cape, peers = iter(CAPE_COLORS), iter(PEER_COLORS)
    return {m: next(cape if m.startswith("cape") else peers, "black") for m in methods}


def panel_figure(records: list[dict], by: str = "setting"):
    """Per setting (``by="member"``: per member, over its settings and seeds): the metric of each of issue 54's
    figures (:data:`ISSUE_FIGURES`, its fixed bound dashed), cape's against the peers'."""
    matplotlib.use("Agg")
    frame = pd.DataFrame([r for r in records if r["status"] == "ok"])
    settings = list(dict.fromkeys(frame[by]))
    methods = list(dict.fromkeys(frame["method"]))
    keys = ["setting", "member", "method", "seed"]
    kept = frame[frame["metric"] == "kept"].merge(frame[frame["metric"] == "true_edges"], on=keys)
    kept = kept.assign(metric="kept / true", value=kept["value_x"] / kept["value_y"])
    frame = pd.concat([frame, kept[[*keys, "metric", "value"]]])
    panels = [(metric, bound) for _, metric, _, _, bound in ISSUE_FIGURES]  # the metrics the figures are checked on
    height = max(3.0, 1.2 + 0.16 * len(settings) * len(methods))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), height))
    width = 0.8 / max(1, len(methods))
    colors = _method_colors(methods)
    for ax, (metric, line) in zip(axes, panels, strict=True):
        med = frame[frame["metric"] == metric].groupby([by, "method"])["value"].median()
        for k, method in enumerate(methods):
            values = [med.get((s, method), np.nan) for s in settings]
            ax.barh(np.arange(len(settings)) + k * width, np.nan_to_num(values), height=width, label=method,
                    color=colors[method])
        if line is not None:
            ax.axvline(line, color="0.4", ls="--", lw=0.8)
        ax.set_yticks(np.arange(len(settings)) + 0.4 - width / 2,
                      settings if metric == panels[0][0] else [""] * len(settings), fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(f"median {metric}")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(methods), fontsize=8,
               frameon=False)
    over = "seeds" if by == "setting" else "settings and seeds"
    fig.suptitle(f"Count-simulator panel: Step I (reds) against its peers, median over {over} (dashed: the issue's "
                 "bounds, kept ≤ 2× true, gap closed ≥ 0.5)", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
