"""``cape-bench causal``: cape's Step I against gcastle and DAGMA peers on synthetic SEMs and Sachs 2005.

Settings (issue 3 / paper Fig. 3): ``fig3`` is a 10-node Barabási–Albert DAG, 5,000 samples, MLP SEM with
Gaussian noise; ``m20``/``m50``/``m100`` the same with M = 20/50/100 nodes (2M edges requested, as gcastle's
BA generator attaches round(n_edges / n_nodes) = 2 edges per new node); ``sachs_obs`` the 853 cells of the
CD3/CD28 condition of Sachs et al. (2005) and ``sachs_all`` all 7,466 cells, log1p-transformed, against the
consensus graph. Every method sees the same matrix. cape runs in this process (dense and low-rank A,
τ = 0.2 and the other paper defaults; the ``*_raw`` variants keep the genes' scales, see
:data:`CAPE_METHODS`); each peer runs in a subprocess with a time budget
(:mod:`cape_benchmarks.peers`), its own default threshold (0.3) and library defaults. Seeds
``seed_offset``..``seed_offset + n - 1`` seed the simulated data and the methods (choose settings on one
range of seeds, report another). Wall time is measured around each fit.

``inputs`` picks what every method is fed: ``"raw"`` (the simulated matrix as is) and/or
``"standardized"`` (each variable z-scored first). On simulated SEMs the variance grows along the causal
order, a cue least-squares methods exploit on raw data and lose on standardised data; running both shows
how much of a method's score comes from it. Each record carries ``input``.

Count data (issue 31): ``grn_control`` is :func:`cape.data.simulate_grn_cells` at its quick size (200 genes, 300
true edges, 2,000 control cells in 5 cell types, NB counts with dropout) with the control cells only, and
``grn_knockout`` the same plus its 30 single and 30 double knock-outs (1,800 cells) with their labels
(``grn_control_2000``: the control cells of the same design at 2,000 genes, 3,000 edges and 10,000 cells,
``grn_knockout_2000`` the same with its knock-outs; ``grn_knockout_100cells`` and ``grn_knockout_300cells`` the quick
design with 100 or 300 cells per knock-out instead of 30); each seed
simulates a new network, ``cape.pp.preprocess(min_genes=20)`` log-normalises it, and every method sees that
matrix. ``cape_default`` is what :func:`cape.tl.causal_graph` runs by default (rank ``"auto"``, λs ``None``,
``screen="partial_correlation"``, ``tau="budget"``, and the knock-out labels where the setting has them, in the fit
and to orient the kept edges by :func:`cape.causal.orient_by_shifts`); ``cape_default_nolabels`` the same
without the labels, ``cape_default_leave_out`` with them in the fit only and ``cape_default_orient_only`` with them
in the orientation only (``leave_out_targets=False``); ``cape_paper`` the paper's Step I (rank 40, λs 1, τ 0.2).
The undirected peers ``partial_correlation`` (pairs significant at 5 % FDR by Fisher's z, the test users know,
:func:`cape.causal.edge_budget` with ``test="fisher"``) and
``graphical_lasso`` (sklearn's ``GraphicalLasso``, α 0.02, on z-scored genes, its strongest pairs, as many as
``partial_correlation`` keeps) return each pair in both directions: compare them on ``skeleton_f1`` (F1 of the
undirected edges), ``auprc`` and ``epr`` (BEELINE's early precision ratio of the same ranking); their ``f1`` is
gcastle's, which credits an undirected pair in either direction. ``sachs_conditions`` is Sachs et al. (2005) as
:func:`cape.data.sachs_interventions` labels it (the control cells and the 6 conditions that target a measured
protein, 6,553 cells, log1p), with those labels for ``cape_default``; ``sachs_all_conditions`` all 7,466 cells,
pma's cells labelled as a second intervention on PKC. ``bn_ecoli70`` and ``bn_arth150`` are
bnlearn's linear Gaussian networks learnt from E. coli and A. thaliana expression (46 genes / 70 arcs, 107 / 150;
:mod:`cape.data.gaussian_bn`, the network file from the pgmpy wheel): 2,000 observational cells per seed, and with
``_knockdown`` 100 cells more per knock-down of the 10 genes with the most descendants, labelled for
``cape_default``. ``sergio_ecoli70`` is SERGIO's counts (:mod:`cape_benchmarks.sergio`, GPL-3, in its own
environment: ``make sergio-env``) on ecoli70's DAG and signs: 5 cell types of 400 cells, normalised and log1p.

Where a setting has intervention labels, every graph also gets ``f1_labels_ceiling``: its directed F1 once every
kept pair that is a true edge touching a perturbed gene is turned to the true direction
(:func:`oriented_by_truth`), the most that orienting by those labels could add to that skeleton.

Outputs under ``out``: ``causal.json`` (records: setting, method, seed, metric, value, status),
``causal.md`` (mean ± sd) and ``causal.png``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import anndata as ad
import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from sklearn.metrics import average_precision_score

from cape import data
from cape._arrays import zscore_columns
from cape._errors import CapeInputError
from cape._io import save_figure, write_json, write_text
from cape._tables import mean_sd_table
from cape.causal import (
    PAIR_RANKING,
    CausalConfig,
    descendant_evidence,
    edge_confidence,
    edge_order,
    fit_parents_mlp,
    fit_variational_notears,
    is_dag,
    make_dag,
    orient_by_likelihood,
    orient_by_shifts,
    pair_ranking_for,
    ranked_pairs,
    shift_tests,
    shrunk_partial_correlations,
)
from cape.causal.causal_config import LOW_RANK
from cape.causal.pipeline import budget_dag
from cape.causal.pipeline import screen as step1_screen
from cape.causal.postprocess import (
    AUTO_TAU_MAX,
    BUDGET_CELLS,
    BUDGET_FDR,
    BUDGET_FILL_FDR,
    BUDGET_TEST,
    BUDGET_TESTS,
    budget_rows,
    budget_tests,
    choose_tau,
    count_budget,
    edge_budget,
    partial_correlation_tests,
    partial_correlations,
)
from cape.causal.structure_recovery import dag_metrics
from cape.data.gaussian_bn import read_gaussian_bn
from cape.data.grn_cells import GRN_SIMULATIONS, simulate_grn_cells
from cape.data.perturbation_data import sachs_interventions
from cape.data.simulate import simulate_sem
from cape.pp import preprocess
from cape.tl import intervention_mask

from .peers import PEERS, RANKING_PEERS, run_peer
from .sergio import simulate_sergio

__all__ = ["CAPE_METHODS", "DIAGNOSE", "INPUTS", "SETTINGS", "run_causal_benchmark", "standardized"]

logger = logging.getLogger("cape")

SETTINGS = {
    "fig3": {"kind": "sem", "n_nodes": 10, "n_samples": 5000},
    "m20": {"kind": "sem", "n_nodes": 20, "n_samples": 5000},
    "m50": {"kind": "sem", "n_nodes": 50, "n_samples": 5000},
    "m100": {"kind": "sem", "n_nodes": 100, "n_samples": 5000},
    **{f"{prefix}{n}_{sem}": {"kind": "sem", "n_nodes": n, "n_samples": 5000, "graph": graph, "sem": sem}
       for prefix, graph in (("er", "erdos_renyi"), ("sf", "scale_free")) for n in (30, 100)
       for sem in ("mlp", "linear")},
    "sachs_obs": {"kind": "sachs", "cells": "observational"},
    "sachs_all": {"kind": "sachs", "cells": "all"},
    "grn_control": {"kind": "grn", "cells": "control"},
    "grn_knockout": {"kind": "grn", "cells": "all"},
    # The same design at 2,000 genes and 10,000 control cells (GRN_SIMULATIONS["scale"]): Step I beyond DENSE_MAX_GENES.
    "grn_control_2000": {"kind": "grn", "cells": "control", "size": "scale"},
    # ... and with its 30 single and 30 double knock-outs (1,800 cells more) and their labels.
    "grn_knockout_2000": {"kind": "grn", "cells": "all", "size": "scale"},
    # Between the two: 500 genes, 800 edges, 5,000 control cells (GRN_SIMULATIONS["full"], 8 cell types, 5 programs).
    "grn_control_500": {"kind": "grn", "cells": "control", "size": "full"},
    # The quick knock-out design with 100 or 300 cells per knock-out instead of 30: what the labels add once each
    # knock-out's effects on its descendants can be seen.
    **{f"grn_knockout_{n}cells": {"kind": "grn", "cells": "all", "per_knockout": n} for n in (100, 300)},
    "sachs_conditions": {"kind": "sachs", "cells": "conditions"},
    # All 7,466 cells with their labels: pma (PKC activator) joins g0076 (PKC inhibitor) as "PKC+ctrl".
    "sachs_all_conditions": {"kind": "sachs", "cells": "all_conditions"},
    # bnlearn's linear Gaussian networks learnt from expression data (cape.data.gaussian_bn): 2,000 observational
    # cells, and with ``_knockdown`` 100 more per knock-down of the 10 genes with the most descendants.
    **{f"bn_{name}{suffix}": {"kind": "bn", "network": name, "knockdowns": k}
       for name in ("ecoli70", "arth150") for suffix, k in (("", 0), ("_knockdown", 10))},
    # SERGIO counts (5 cell types × 400 cells, its DS1 technical noise) on the ecoli70 network; make sergio-env.
    "sergio_ecoli70": {"kind": "sergio", "network": "ecoli70"},
}
#: cape variants: library defaults (each gene standardised), and ``*_raw``: fed the unstandardised matrix the
#: peers see, keeping the genes' relative scales (``standardize="none"``, ``feature_norm="data"``). On
#: simulated SEMs the variance grows along the causal order ("varsortability", Reisach et al. 2021), which
#: least-squares methods such as NOTEARS exploit on raw data; standardising removes that cue for everyone.
CAPE_METHODS = {
    # Step I as cape.tl.causal_graph ran it before issue 31: rank 40 (dense when M ≤ 40), λs 1; see cape_default.
    "cape": {"rank": "default"},
    # One experiment per suspected cause of a loss against a peer (``--diagnose``), each changing one thing:
    "cape_lambda0.3": {"rank": "default", "lambda_sparse": 0.3},  # sparsity scale
    "cape_lambda3": {"rank": "default", "lambda_sparse": 3.0},
    "cape_linear": {"rank": "default", "hidden": 0},  # the element-wise nonlinearity (off: linear SEM)
    "cape_batch1000": {"rank": "default", "batch_size": 1000},  # minibatch optimisation
    "cape_epochs300": {"rank": "default", "epochs": 300, "min_epochs": 300},  # under-training
    # The augmented Lagrangian's ρ capped at 1e8 whatever the parameterisation (the cap before low rank got 1e4).
    "cape_rho1e8": {"rank": "default", "rho_max": 1e8},
    # Nonlinear parents: each gene an MLP of all its candidate parents (cape.causal.parents_mlp).
    "cape_parents_mlp": {"model": "parents_mlp"},
    "cape_dense": {"rank": None},
    "cape_low_rank": {"rank": "low"},
    "cape_dense_raw": {"rank": None, "standardize": "none", "feature_norm": "data"},
    "cape_low_rank_raw": {"rank": "low", "standardize": "none", "feature_norm": "data"},
    # cape.tl.causal_graph's defaults (issue 31): rank "auto", λs None, tau "budget", labels where the setting has them.
    # ("labels": each target's own equation left out of the fit; "orient": kept edges turned by the shift tests.)
    "cape_default": {"rank": "auto", "tau": "budget", "labels": True, "orient": True},
    "cape_default_nolabels": {"rank": "auto", "tau": "budget", "labels": False},
    # The labels in the fit only (the default before orient_by_shifts), and in the orientation only.
    "cape_default_leave_out": {"rank": "auto", "tau": "budget", "labels": True},
    "cape_default_orient_only": {"rank": "auto", "tau": "budget", "labels": False, "orient": True},
    "cape_default_noscreen": {"rank": "auto", "tau": "budget", "labels": True, "screen": False},
    # The default with a lower L1 price (λs 0.1 instead of the dense A's 0.3): weak screened candidates at scale.
    "cape_default_lambda0.1": {"rank": "auto", "tau": "budget", "labels": True, "lambda_sparse": 0.1},
    # The default with ρ capped at 1e4 at any size (a dense A's cap is 1e8 up to 1,000 genes).
    "cape_default_rho1e4": {"rank": "auto", "tau": "budget", "labels": True, "rho_max": 1e4},
    # Nonlinear parents with the labels and the default's threshold (model="parents_mlp", tau="budget").
    "cape_parents_mlp_labels": {"model": "parents_mlp", "tau": "budget", "labels": True},
    # The paper's Step I: rank 40 (dense below 41 genes), λs 1, τ 0.2.
    "cape_paper": {"rank": "default", "lambda_sparse": 1.0, "tau": AUTO_TAU_MAX},
}
#: False discovery rate of the undirected peers' pairs (the usual 5 %; cape's budget uses its own, BUDGET_FDR).
PEER_FDR = 0.05
#: Undirected peers run in this process (sklearn / NumPy): each returns every chosen pair in both directions.
UNDIRECTED_PEERS = {
    "partial_correlation": "|partial correlation|, pairs significant at 5 % FDR (Fisher z, Benjamini–Hochberg)",
    "graphical_lasso": "sklearn GraphicalLasso (alpha 0.02) on z-scored genes, its strongest pairs, as many as "
                       "partial_correlation keeps",
}
QUICK = {"settings": ["fig3"], "n_samples": 2000, "seeds": 2, "budget": 60.0,
         "methods": ["cape_dense", "cape_low_rank", "notears", "dagma_linear"]}
METRICS = ("shd", "tpr", "fdr", "f1", "skeleton_f1", "auprc", "epr", "nnz")
INPUTS = ("raw", "standardized")


#: Prefixes of a budget threshold naming the pair ranking that picks its pairs (``"budget"`` alone: Step I's
#: default, :data:`cape.causal.PAIR_RANKING`).
BUDGET_RANKINGS = {"fit-": "fit", "consensus-": "consensus", "shrunk-": "shrunk_partial_correlation"}


def _ranking_prefix(text: str) -> str:
    """The pair-ranking prefix of a threshold (``""`` where it has none)."""
    return next((prefix for prefix in BUDGET_RANKINGS if text.startswith(prefix)), "")


def parse_tau(value: float | str) -> float | str:
    """A threshold of ``--taus``: a number > 0, ``"auto"``, ``"budget"`` (at :data:`BUDGET_FDR`), ``"budget<fdr>"``
    (the edge budget at that false discovery rate, e.g. ``"budget0.2"``), its pairs ranked as Step I's default ranks
    them (:data:`cape.causal.PAIR_RANKING`), or with a ranking's prefix (:data:`BUDGET_RANKINGS`): ``"fit-budget"``
    (the fit's heaviest weights alone, ``pair_ranking="fit"``), ``"consensus-budget"``, ``"shrunk-budget"``
    (``pair_ranking="shrunk_partial_correlation"``), each also with a rate. A budget counted by another test than the
    default (:data:`cape.causal.BUDGET_TESTS`) takes it as a suffix: ``"budget0.05:both"``."""
    text = str(value)
    body, _, test = text.partition(":")
    if test:
        if test not in BUDGET_TESTS or "budget" not in body:
            raise CapeInputError(f"a budget's test must be one of {', '.join(BUDGET_TESTS)}, after a budget "
                                 f"threshold, got {text!r}")
        return f"{parse_tau(body)}:{test}"
    if text in ("auto", "budget"):
        return text
    prefix = _ranking_prefix(text)
    body = text.removeprefix(prefix)
    if body == "budget":
        return text
    try:
        number = float(body.removeprefix("budget"))
    except ValueError as err:
        rankings = ", ".join(BUDGET_RANKINGS)
        raise CapeInputError(f"a threshold must be a number, 'auto', '[<ranking>-]budget' or '[<ranking>-]budget<fdr>' "
                             f"(rankings: {rankings}), got {text!r}") from err
    if body.startswith("budget"):
        if not 0 < number < 1:
            raise CapeInputError(f"the budget's false discovery rate must be in (0, 1), got {text!r}")
        return f"{prefix}budget{number:g}"
    if not number > 0 or prefix:
        raise CapeInputError(f"thresholds must be > 0, got {text}")
    return number


def _budget_fdr(tau: float | str) -> float | None:
    """The false discovery rate of a budget threshold (``None`` for the others)."""
    if not isinstance(tau, str):
        return None
    body = tau.partition(":")[0].removeprefix(_ranking_prefix(tau))
    if not body.startswith("budget"):
        return None
    rate = body.removeprefix("budget")
    return BUDGET_FDR if rate == "" else float(rate)


def _budget_test(tau: float | str) -> str:
    """The test a budget threshold counts by: its ``:<test>`` suffix, else Step I's default."""
    return str(tau).partition(":")[2] or BUDGET_TEST


def _budget_cells(X: np.ndarray, seed: int) -> np.ndarray:
    """The cells Step I's budget tests on: at most the default ``budget_cells``, drawn with the fit's seed."""
    rows = budget_rows(*X.shape, BUDGET_CELLS, seed)
    return X if rows is None else X[rows]


def _budget(X: np.ndarray, fdr: float, seed: int, test: str = BUDGET_TEST,
            fill_fdr: float | None = BUDGET_FILL_FDR) -> int | None:
    """cape's edge budget at ``fdr`` as :func:`cape.tl.causal_graph` counts it: by ``test``, on
    :func:`_budget_cells`, less the pairs the test calls on the same cells with every gene permuted, filled towards
    one pair per gene at ``fill_fdr`` (:func:`cape.causal.count_budget`, the fit's seed)."""
    count = count_budget(_budget_cells(X, seed), None, fdr, fill_fdr, test, seed)
    return None if count is None else count.n_pairs


def _thresholded(weights: np.ndarray, X: np.ndarray, tau: float | str, seed: int, intervened=None) -> np.ndarray:
    """cape's graph at one threshold rule, as Step I's pipeline makes it: a budget rule counts the data's
    significant pairs at its FDR and keeps that many pairs by its pair ranking (Step I's default, resolved by the
    intervention mask the pipeline was given, ``intervened``, or the one its prefix names,
    :data:`BUDGET_RANKINGS`); without a mask, the edges turned where the likelihood says so."""
    fdr = _budget_fdr(tau)
    budget = _budget(X, fdr, seed, _budget_test(tau)) if fdr is not None else None
    ranking = pair_ranking_for(BUDGET_RANKINGS.get(_ranking_prefix(str(tau)), PAIR_RANKING), intervened)
    dag = None
    if budget is not None and ranking != "fit":
        judged = np.isfinite(budget_tests(_budget_cells(X, seed), _budget_test(tau))[1])  # as the pipeline keeps
        chosen = budget_dag(weights, budget, ranked_pairs(ranking, weights, partial_correlation_tests(X), X), judged)
        dag = None if chosen is None else chosen[0]
    if dag is None:
        rule = "budget" if fdr is not None else tau
        dag = make_dag(weights, choose_tau(weights, rule, AUTO_MIN_POSITIONED, budget)[0])[0]
    # without labels the pipeline then turns the edges the likelihood supports (CausalConfig.orient_by_likelihood)
    return dag if intervened is not None else orient_by_likelihood(X, dag)[0]


def _top_pairs(scores: np.ndarray, k: int) -> np.ndarray:
    """The k highest-scoring gene pairs of a symmetric score matrix, in both directions, weighted by their score."""
    upper = np.triu_indices(scores.shape[0], 1)
    order = np.argsort(-scores[upper], kind="stable")[:k]
    chosen = np.zeros_like(scores)
    chosen[upper[0][order], upper[1][order]] = scores[upper][order]
    return chosen + chosen.T


def _top_directed(scores: np.ndarray, k: int) -> np.ndarray:
    """The k highest-scoring ordered pairs (off the diagonal, score > 0), weighted by their score."""
    flat = np.where(np.eye(scores.shape[0], dtype=bool), 0.0, np.abs(scores)).ravel()
    order = np.argsort(-flat, kind="stable")[:k]
    order = order[flat[order] > 0]
    chosen = np.zeros(flat.size)
    chosen[order] = flat[order]
    return chosen.reshape(scores.shape)


def _low_rank(n_nodes: int) -> int:
    """Rank used by ``cape_low_rank``: the default 40, below M."""
    return max(1, min(40, n_nodes // 2))


def _grn_dataset(cells: str, seed: int, size: str = "quick", per_knockout: int | None = None):
    """simulate_grn_cells (``size``, this seed, ``per_knockout`` cells per knock-out if given), preprocessed; X, truth
    and the knock-out mask (or None)."""
    design = {**GRN_SIMULATIONS[size], "seed": seed}
    if per_knockout is not None:
        design["n_cells_per_perturbation"] = per_knockout
    a = simulate_grn_cells(**design)
    preprocess(a, min_genes=20)
    if cells == "control":
        a = a[a.obs["condition"].astype(str) == "ctrl"].copy()
    X = a.X.toarray() if hasattr(a.X, "toarray") else np.asarray(a.X)
    X = np.asarray(X, dtype=np.float64)
    keep = X.std(0) > 0
    a = a[:, keep].copy()
    mask = None if cells == "control" else intervention_mask(a, "condition", np.asarray(a.var_names))[0]
    return X[:, keep], a.varp["true_dag"].toarray(), mask


def _dataset(setting: str, seed: int, n_samples: int | None):
    """X (samples × variables), the true DAG and the per-cell intervention mask (None without labels)."""
    spec = SETTINGS[setting]
    if spec["kind"] == "sem":

        n = n_samples or spec["n_samples"]
        a = simulate_sem(spec["n_nodes"], 2 * spec["n_nodes"], n, graph=spec.get("graph", "scale_free"),
                         sem=spec.get("sem", "mlp"), seed=seed)
        return np.asarray(a.X, dtype=np.float64), a.varp["true_dag"].toarray(), None
    if spec["kind"] == "grn":
        return _grn_dataset(spec["cells"], seed, spec.get("size", "quick"), spec.get("per_knockout"))
    if spec["kind"] == "sergio":  # the network's DAG and signs; SERGIO's kinetics, cell types and noise per seed
        bn = read_gaussian_bn(data.fetch(spec["network"])["network"], name=spec["network"])
        counts, _, genes = simulate_sergio(bn.weights, seed=seed)
        a = ad.AnnData(counts.astype(np.float32))
        preprocess(a, min_genes=1)  # normalise per cell and log1p; every gene kept
        X = np.asarray(a.X.toarray() if hasattr(a.X, "toarray") else a.X, dtype=np.float64)
        keep = X.std(0) > 0
        return X[:, keep], bn.weights[np.ix_(genes[keep], genes[keep])], None
    if spec["kind"] == "bn":  # the same network for every seed; the seed draws new cells
        bn = read_gaussian_bn(data.fetch(spec["network"])["network"], name=spec["network"])
        a = bn.simulate(n_control=n_samples or 2000, knockdowns=min(spec["knockdowns"], bn.n_genes), seed=seed)
        mask = intervention_mask(a, "condition", np.asarray(a.var_names))[0] if spec["knockdowns"] else None
        return np.asarray(a.X, dtype=np.float64), a.varp["true_dag"].toarray(), mask

    a = data.load("sachs2005")
    if spec["cells"] in ("conditions", "all_conditions"):  # ctrl and the conditions that target a measured protein
        b = sachs_interventions(a, shared_targets=spec["cells"] == "all_conditions")  # log1p already
        mask = intervention_mask(b, "condition", np.asarray(b.var_names))[0]
        return np.asarray(b.X, dtype=np.float64), b.varp["true_graph"].toarray(), mask
    if spec["cells"] == "observational":
        a = a[a.obs["condition"].astype(str) == "cd3cd28"]
    X = np.log1p(np.asarray(a.X, dtype=np.float64))
    return X, a.varp["true_graph"].toarray(), None


def skeleton_f1(true: np.ndarray, estimated: np.ndarray) -> float:
    """F1 of the undirected edges (a pair counts once, whatever its direction or whether both are given)."""
    T, E = np.asarray(true) != 0, np.asarray(estimated) != 0
    upper = np.triu_indices(T.shape[0], 1)
    t, e = (T | T.T)[upper], (E | E.T)[upper]
    hits = int(np.sum(t & e))
    return 0.0 if hits == 0 else 2.0 * hits / (int(t.sum()) + int(e.sum()))


def oriented_by_truth(true: np.ndarray, estimated: np.ndarray, genes: np.ndarray) -> np.ndarray:
    """``estimated`` with every kept pair that is a true edge and touches one of ``genes`` (boolean mask) turned
    to the true direction: the best any use of those genes' interventions could orient, the skeleton unchanged."""
    T, E = np.asarray(true) != 0, np.asarray(estimated) != 0
    pairs = (E | E.T) & (T | T.T) & (genes[:, None] | genes[None, :])
    E[pairs] = T[pairs]
    return E.astype(float)


def _run_undirected(method: str, X: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """An undirected peer: (chosen pairs, both directions, weighted by |score|; |score| of every pair; seconds)."""
    start = time.perf_counter()
    if method == "partial_correlation":
        scores = np.abs(partial_correlations(X))
        k = edge_budget(X, PEER_FDR, test="fisher") or 0
    else:
        from sklearn.covariance import GraphicalLasso

        precision = GraphicalLasso(alpha=0.02, max_iter=200).fit(standardized(X)).precision_
        d = np.sqrt(np.diag(precision))
        scores = np.abs(precision / np.outer(d, d))
        np.fill_diagonal(scores, 0.0)
        # At α 0.02 most pairs stay nonzero (8,000 of 19,900 on grn_control): keep as many as partial correlation.
        k = min(edge_budget(X, PEER_FDR, test="fisher") or 0, int(np.count_nonzero(np.triu(scores > 1e-8, 1))))
    return _top_pairs(scores, k), scores, time.perf_counter() - start


def standardized(X: np.ndarray) -> np.ndarray:
    """Each column centred and divided by its standard deviation (constant columns become 0)."""
    return zscore_columns(X)[0]


#: ``--diagnose``: the cape variants above and the thresholds every fit is also scored at.
DIAGNOSE = {"methods": ["cape", "cape_lambda0.3", "cape_lambda3", "cape_linear", "cape_batch1000",
                        "cape_epochs300", "cape_parents_mlp", "sdcd"],
            "taus": [0.05, 0.1, 0.2, 0.3, "auto"]}
#: τ of the cape rows without a rule of their own: the paper's 0.2 (where ``tau="auto"`` starts).
PAPER_TAU = AUTO_TAU_MAX
#: ``tau="auto"``'s share of genes that must keep an edge (:func:`cape.tl.causal_graph`'s default).
AUTO_MIN_POSITIONED = CausalConfig().min_positioned


def _run_cape(method: str, X: np.ndarray, seed: int, intervened=None) -> tuple[np.ndarray, float]:
    """Fit one cape variant; returns the weighted adjacency (before thresholding) and the wall time."""
    options = dict(CAPE_METHODS[method])
    options.pop("tau", None)
    screen = options.pop("screen", True)
    options.pop("orient", None)
    if options.pop("labels", False) and intervened is not None:
        options["intervened"] = intervened
    if options.pop("model", None) == "parents_mlp":
        start = time.perf_counter()
        fit = fit_parents_mlp(X, seed=seed, device="cpu", progress_desc=method, **options)
        return fit.adjacency, time.perf_counter() - start
    if options["rank"] == "auto":  # resolved by Step I's pipeline, as cape.tl.causal_graph resolves rank="auto"
        step1 = CausalConfig(rank="auto", lambda_sparse=options.get("lambda_sparse"),
                             screen="partial_correlation" if screen else "none")
        candidates = step1_screen(step1, X)[1]
        options["rank"] = step1.rank_for(X.shape[1], screened=candidates is not None)
        options["lambda_sparse"] = step1.lambda_for(options["rank"])
        if candidates is not None:
            options["candidates"] = candidates
    if options["rank"] == "low":
        options["rank"] = _low_rank(X.shape[1])
    elif options["rank"] == "default":
        options["rank"] = LOW_RANK if X.shape[1] > LOW_RANK else None
    start = time.perf_counter()
    fit = fit_variational_notears(X.astype(np.float32), seed=seed, device="cpu", progress_desc=method, **options)
    return fit.adjacency, time.perf_counter() - start


#: Scores of Step I's edge confidence among a cape graph's kept edges (skeleton truth: an edge is right when its
#: pair is linked either way): the kept edges' precision (a random ranking's AUPRC), the confidence's AUPRC and the
#: share of the gap from the first to 1 that it closes; ``ordered_*``: the same for the order of
#: :func:`cape.causal.edge_order` (the confidence, its ties broken by the partial correlation's size).
CONFIDENCE_METRICS = ("kept_precision", "confidence_auprc", "confidence_gap_closed", "ordered_confidence_auprc",
                      "ordered_confidence_gap_closed")


def kept_edge_scores(truth: np.ndarray, dag: np.ndarray, confidence: np.ndarray | None,
                     partial_correlation: np.ndarray | None = None,
                     pair_partial_correlation: np.ndarray | None = None) -> dict[str, float]:
    """:data:`CONFIDENCE_METRICS` of ``confidence`` (M×M) on the edges of ``dag``: ``kept_precision`` alone without
    a confidence or where every kept edge is right or wrong (nothing to rank), ``{}`` without edges; the ``ordered_``
    pair with ``partial_correlation`` (the edges in :func:`cape.causal.edge_order`'s order, with
    ``pair_partial_correlation`` where given)."""
    rows, cols = np.nonzero(dag)
    if not rows.size:
        return {}
    right = ((truth != 0) | (truth != 0).T)[rows, cols]
    precision = float(right.mean())
    out = {"kept_precision": precision}
    if confidence is None or right.all() or not right.any():
        return out
    rankings = {"confidence": confidence[rows, cols]}
    if partial_correlation is not None:
        pair = None if pair_partial_correlation is None else pair_partial_correlation[rows, cols]
        rankings["ordered_confidence"] = edge_order(confidence[rows, cols], partial_correlation[rows, cols], pair)
    for name, score in rankings.items():
        auprc = float(average_precision_score(right, score))
        out |= {f"{name}_auprc": auprc, f"{name}_gap_closed": (auprc - precision) / (1.0 - precision)}
    return out


def confidence_scores(truth: np.ndarray, W: np.ndarray, X: np.ndarray, intervened, seed: int) -> dict[str, float]:
    """:data:`CONFIDENCE_METRICS` of :func:`cape.causal.edge_confidence` on the graph ``W`` (empty without edges or
    without both right and wrong edges)."""
    linked = (truth != 0) | (truth != 0).T
    right = linked[np.nonzero(W)]
    if right.all() or not right.any():
        return {}
    result = edge_confidence(X, W, intervened=intervened, seed=seed,
                             pair_partial_correlation=shrunk_partial_correlations(X))
    return kept_edge_scores(truth, W, result.confidence, result.partial_correlation, result.pair_partial_correlation)


def run_causal_benchmark(out: str | Path = "results/bench", quick: bool = False,
                         settings: list[str] | None = None, methods: list[str] | None = None,
                         n_seeds: int | None = None, budget: float | None = None, seed_offset: int = 0,
                         inputs: list[str] | None = None, taus: list[float | str] | None = None) -> list[dict]:
    """Run the benchmark and write ``causal.json``/``.md``/``.png`` under ``out``; returns the records.

    ``inputs``: any of :data:`INPUTS` (default ``["raw"]``); ``seed_offset``: first seed; ``taus``: extra
    thresholds each cape fit is also scored at (records of method ``"<method>@τ<t>"``, same fit and time;
    ``"auto"``: the positioning rule, genes positioned ≥ :data:`AUTO_MIN_POSITIONED`; ``"budget"`` and
    ``"budget<fdr>"``: the edge budget, see :func:`parse_tau`; the undirected peers also get rows at each budget,
    their strongest pairs as many as the budget counts);
    cape's own rows use :data:`PAPER_TAU`.
    """

    settings = settings or (QUICK["settings"] if quick else list(SETTINGS))
    methods = methods or (QUICK["methods"] if quick else [*CAPE_METHODS, *PEERS, *UNDIRECTED_PEERS])
    unknown = [s for s in settings if s not in SETTINGS] + [
        m for m in methods if m not in PEERS and m not in CAPE_METHODS and m not in UNDIRECTED_PEERS]
    if unknown:
        raise CapeInputError(f"unknown setting or method: {', '.join(unknown)}")
    inputs = list(inputs or ["raw"])
    if not inputs or any(i not in INPUTS for i in inputs):
        raise CapeInputError(f"inputs must be among {', '.join(INPUTS)}, got {', '.join(inputs) or 'none'}")
    if seed_offset < 0:
        raise CapeInputError(f"seed_offset must be ≥ 0, got {seed_offset}")
    taus = [parse_tau(t) for t in (taus or [])]
    n_seeds = n_seeds or (QUICK["seeds"] if quick else 5)
    budget = budget or (QUICK["budget"] if quick else 600.0)
    n_samples = QUICK["n_samples"] if quick else None
    records: list[dict] = []
    for setting in settings:
        # Sachs data are fixed: seeds only change the methods' initialisation.
        for seed in range(seed_offset, seed_offset + n_seeds):
            X_raw, truth, intervened = _dataset(setting, seed, n_samples)
            for kind in inputs:
                X = X_raw if kind == "raw" else standardized(X_raw)
                evidence = None if intervened is None else descendant_evidence(shift_tests(X, intervened))
                for method in methods:
                    base = {"setting": setting, "input": kind, "method": method, "seed": seed,
                            "n_samples": int(X.shape[0]), "n_nodes": int(X.shape[1])}
                    graphs: dict[str, np.ndarray | None] = {}
                    ranking = None  # scores of every pair for the AUPRC, when not the graph's own weights
                    if method in CAPE_METHODS:
                        weights, seconds = _run_cape(method, X, seed, intervened)
                        status = "ok"
                        # the labels reach Step I's pipeline where the fit or the orientation uses them
                        given = CAPE_METHODS[method].get("labels") or CAPE_METHODS[method].get("orient")
                        labels = intervened if given else None
                        graphs[method] = _thresholded(weights, X, CAPE_METHODS[method].get("tau", PAPER_TAU), seed,
                                                      labels)
                        graphs.update({f"{method}@τ{t if isinstance(t, str) else f'{t:g}'}":
                                       _thresholded(weights, X, t, seed, labels) for t in taus})
                        if CAPE_METHODS[method].get("orient") and evidence is not None:
                            graphs = {k: orient_by_shifts(G, evidence).dag for k, G in graphs.items()}
                        ranking = weights
                    elif method in UNDIRECTED_PEERS:
                        start = time.perf_counter()
                        try:
                            graphs[method], ranking, seconds = _run_undirected(method, X, seed)
                        except FloatingPointError as err:  # sklearn's graphical lasso on ill-conditioned data
                            logger.warning("%s seed %d %s failed: %s", setting, seed, method, err)
                            graphs[method], seconds, status = None, time.perf_counter() - start, "failed"
                        else:
                            # The same pairs' ranking cut at each budget's count, for a like-for-like comparison.
                            graphs.update({f"{method}@τ{t}": _top_pairs(ranking, _budget(X, _budget_fdr(t), seed,
                                                                                       _budget_test(t)) or 0)
                                           for t in taus if _budget_fdr(t) is not None})
                            status = "ok"
                    else:
                        result = run_peer(method, X, budget=budget, seed=seed, threads=torch.get_num_threads(),
                                          intervened=intervened)
                        graphs[method], seconds, status = result.adjacency, result.seconds, result.status
                        if method in RANKING_PEERS and result.adjacency is not None:
                            # Scores of every ordered pair: the graph is the top pairs, as many as cape's budget.
                            ranking = result.adjacency
                            graphs[method] = _top_directed(ranking, _budget(X, BUDGET_FDR, seed) or 0)
                    for name, W in graphs.items():
                        row = {**base, "method": name}
                        records.append({**row, "metric": "seconds", "value": float(seconds), "status": status})
                        if W is not None:
                            records.append({**row, "metric": "acyclic", "value": float(is_dag(W)),
                                            "status": status})
                        scores = dag_metrics(truth, W) if W is not None else dict.fromkeys(METRICS, float("nan"))
                        if W is not None:
                            scores["skeleton_f1"] = skeleton_f1(truth, W)
                            if intervened is not None:  # the labels' ceiling on this graph's directed F1
                                perturbed = np.asarray(intervened.sum(0)).ravel() > 0
                                scores["f1_labels_ceiling"] = dag_metrics(
                                    truth, oriented_by_truth(truth, W, perturbed))["f1"]
                            if ranking is not None:  # every pair's score, not only the kept edges'
                                ranked = dag_metrics(truth, ranking)
                                scores["auprc"], scores["epr"] = ranked["auprc"], ranked["epr"]
                            if name in CAPE_METHODS:  # how well Step I's edge confidence ranks its kept edges
                                scores |= confidence_scores(truth, W, X, intervened, seed)
                        records.extend({**row, "metric": k, "value": float(scores[k]), "status": status}
                                       for k in (*METRICS, "f1_labels_ceiling", *CONFIDENCE_METRICS) if k in scores)
                        logger.info("%s %s seed %d %s: %s, SHD %s, F1 %.3g, %.1f s", setting, kind, seed, name,
                                    status, scores["shd"], scores["f1"], seconds)
    out = Path(out)
    write_json(records, out / "causal.json")
    table = mean_sd_table(records, rows=["setting", "input", "method"], columns=["metric"])
    timeouts = [r for r in records if r["status"] != "ok" and r["metric"] == "seconds"]
    acyclic = pd.DataFrame([r for r in records if r["metric"] == "acyclic"])
    acyclic_line = ("" if acyclic.empty else
                    f"Returned graphs that are DAGs: {int(acyclic['value'].sum())} of {len(acyclic)}"
                    + "".join(f"; {m}: {int(g.sum())} of {len(g)}"
                              for m, g in acyclic.groupby("method", sort=False)["value"] if g.sum() < len(g))
                    + ".\n\n")
    notes = [f"- {r['setting']} {r['input']} seed {r['seed']} {r['method']}: {r['status']} after {r['value']:.0f} s"
             for r in timeouts]
    seeds = f"seeds {seed_offset}–{seed_offset + n_seeds - 1}" if n_seeds > 1 else f"seed {seed_offset}"
    text = (f"# Causal discovery benchmark{' (quick)' if quick else ''}\n\n"
            f"mean ± sd over {n_seeds} seed(s) ({seeds}); input: {', '.join(inputs)}"
            + (" (standardized = every method sees z-scored variables)" if "standardized" in inputs else "")
            + f"; per-peer budget {budget:.0f} s; seconds = wall time of the fit.\n\n"
            f"{acyclic_line}{table}\n\nMedian over seeds:\n\n{_median_table(records)}\n"
            + ("\nRuns without a result (metrics left out of the means):\n" + "\n".join(notes) + "\n"
               if notes else ""))
    write_text(text, out / "causal.md")
    save_figure(_figure(records), out / "causal.png")
    return records


def _median_table(records: list[dict],
                  metrics: tuple[str, ...] = ("shd", "f1", "skeleton_f1", "auprc", "epr", "f1_labels_ceiling", "nnz",
                                             "kept_precision", "confidence_auprc", "confidence_gap_closed",
                                             "ordered_confidence_gap_closed", "seconds")) -> str:
    """Markdown table of the median over seeds of ``metrics`` per setting, input and method (finished runs)."""

    frame = pd.DataFrame([r for r in records if r["metric"] in metrics and r.get("status", "ok") == "ok"])
    if frame.empty:
        return "(no finished runs)"
    wide = (frame.groupby(["setting", "input", "method", "metric"], sort=False)["value"].median()
            .unstack("metric").reindex(columns=list(metrics)).reset_index())
    lines = ["| setting | input | method | " + " | ".join(f"median {m}" for m in metrics) + " |",
             "|" + "---|" * (3 + len(metrics))]
    for row in wide.itertuples(index=False):
        values = " | ".join("–" if pd.isna(v) else f"{v:.3g}" for v in row[3:])
        lines.append(f"| {row[0]} | {row[1]} | {row[2]} | {values} |")
    return "\n".join(lines)


def _figure(records: list[dict]):
    matplotlib.use("Agg")

    if len({r.get("input", "raw") for r in records}) > 1:
        # One bar group per setting and input.
        records = [{**r, "setting": f"{r['setting']} ({r.get('input', 'raw')})"} for r in records]
    frame = pd.DataFrame(records)
    failed = {(r["setting"], r["method"]): r["status"] for r in records if r.get("status", "ok") != "ok"}
    panels = ["shd", "f1", "seconds"]
    settings = list(dict.fromkeys(frame["setting"]))
    methods = list(dict.fromkeys(frame["method"]))
    height = max(3.0, 0.5 + 0.3 * len(methods) * len(settings))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), height))
    for ax, metric in zip(axes, panels, strict=True):
        sub = frame[frame["metric"] == metric]
        stats = sub.groupby(["setting", "method"])["value"].agg(["mean", "std"])
        labels, means, sds, colors = [], [], [], []
        for si, s in enumerate(settings):
            for m in methods:
                if (s, m) in stats.index:
                    labels.append(f"{s} · {m}" + (f" ({failed[(s, m)]})" if (s, m) in failed else ""))
                    means.append(stats.loc[(s, m), "mean"])
                    sds.append(np.nan_to_num(stats.loc[(s, m), "std"]))
                    colors.append("tab:red" if m.startswith("cape") else f"C{si % 10}")
        y = np.arange(len(labels))
        ax.barh(y, np.nan_to_num(means), xerr=sds, color=colors, alpha=0.8)
        ax.set_yticks(y, labels if metric == panels[0] else [""] * len(labels), fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(metric + (" (log)" if metric == "seconds" else ""))
        if metric == "seconds":
            ax.set_xscale("log")
            # Plain labels at 1-2-5 steps; the default minor labels overlap.
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
    fig.suptitle("Causal discovery: cape (red) vs peers — mean ± sd over seeds")
    fig.tight_layout()
    return fig
