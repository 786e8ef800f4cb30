"""``cape.tl.causal_graph``: Step I on an AnnData — the weighted causal gene DAG in ``varp["cape_dag"]``."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anndata as ad
import numpy as np
import scipy.sparse as sp
import torch

from .. import __version__
from .._errors import CapeInputError
from .._options import with_options
from .._settings import resolve_device, resolve_seed, seed_everything
from ..causal import (
    MIN_CELLS,
    fit_parents_mlp,
    fit_variational_notears,
    learned_equations,
    make_dag,
    positioned_genes,
    tau_positioning,
)
from ..causal import parents_mlp as _parents_mlp
from ..causal.causal_config import (
    DENSE_MAX_GENES,
    LAMBDA_DENSE,
    LAMBDA_LOW_RANK,
    LOW_RANK,
    MODELS,
    SCREENS,
    CausalConfig,
)
from ..causal.intervention_orientation import (
    MIN_SHIFT_CELLS,
    ORIENT_FDR,
    descendant_evidence,
    orient_by_shifts,
    shift_tests,
)
from ..causal.postprocess import (
    AUTO_TAU_FLOOR,
    AUTO_TAU_MAX,
    BUDGET_TEST_NAMES,
    SCREEN_FDR,
    budget_rows,
    budget_tests,
    choose_tau,
    edge_budget,
    partial_correlation_tests,
    screen_candidates,
)
from ..causal.trainer import gene_moments
from ..data.user_files import detect_scale
from ..tasks.perturbation import CONTROL, intervention_labels
from ._uns import DAG_KEY, step_key

__all__ = ["AUTO_TAU_FLOOR", "AUTO_TAU_MAX", "DATA_KEYS", "DENSE_MAX_GENES", "LAMBDA_DENSE", "LAMBDA_LOW_RANK",
           "LOW_RANK", "MIN_CELLS", "MODELS", "SCAN_TAUS", "SCREENS", "CausalConfig", "causal_graph",
           "intervention_mask"]

logger = logging.getLogger("cape")

#: Most genes the partial-correlation test of ``tau="budget"`` is run on (an M×M inverse); above, ``"auto"``'s rule.
BUDGET_MAX_GENES = 5000
PARENTS_MLP_MAX_GENES = _parents_mlp.MAX_GENES
#: Thresholds at which ``uns["cape"]["causal_graph"]["threshold_scan"]`` counts surviving edges and genes.
SCAN_TAUS = (0.2, 0.1, 0.05, 0.02, 0.01)
#: Keys of the workflow's ``causal:`` section that select data rather than set an option of :class:`CausalConfig`:
#: keyword arguments of :func:`causal_graph`.
DATA_KEYS = ("use_genes", "layer", "interventions")


def _select_genes(adata: ad.AnnData, use_genes, layer: str | None = None) -> np.ndarray:
    """Boolean mask over ``adata.var_names`` of the genes to use (``layer``: the matrix Step I reads, X if None)."""
    if use_genes is None:
        return np.ones(adata.n_vars, dtype=bool)
    if isinstance(use_genes, str):
        if use_genes not in adata.var:
            if use_genes == "cape_used":
                if layer is None and detect_scale(adata) == "counts":  # raw counts, all genes: a forgotten preprocess
                    raise CapeInputError(
                        f"X holds raw counts and var['cape_used'] is missing: run cape.pp.preprocess first "
                        f"(normalise, log1p, select genes), or pass use_genes=None to use all {adata.n_vars} genes "
                        "as they are")
                logger.warning("var['cape_used'] not found (cape.pp.preprocess marks the genes to use): using all "
                               "%d genes", adata.n_vars)
                return np.ones(adata.n_vars, dtype=bool)
            raise CapeInputError(f"use_genes={use_genes!r}: no such boolean column in adata.var")
        column = adata.var[use_genes]
        if column.dtype != bool:
            raise CapeInputError(f"adata.var[{use_genes!r}] must be boolean, got dtype {column.dtype}")
        return column.to_numpy(dtype=bool)
    values = np.asarray(use_genes)
    if values.dtype == bool:
        if values.shape != (adata.n_vars,):
            raise CapeInputError(f"use_genes mask has length {values.size}, expected n_vars = {adata.n_vars}")
        return values
    names = [str(v) for v in values]
    missing = [n for n in names if n not in adata.var_names]
    if missing:
        raise CapeInputError(f"use_genes: {len(missing)} gene(s) not in var_names, e.g. {missing[0]!r}")
    return adata.var_names.isin(names)




def _threshold_scan(A: np.ndarray, taus) -> dict[str, np.ndarray]:
    """Edges kept by :func:`~cape.causal.make_dag` and genes positioned at each τ (descending)."""

    taus = np.array(sorted({float(t) for t in taus}, reverse=True))
    edges = np.array([int(np.count_nonzero(make_dag(A, t)[0])) for t in taus])
    positioned = np.array([int(positioned_genes(A, t).sum()) for t in taus])
    return {"tau": taus, "n_edges": edges, "n_positioned": positioned,
            "positioned_fraction": positioned / max(A.shape[0], 1)}


def _format_scan(scan: dict[str, np.ndarray]) -> str:
    return ", ".join(f"{t:.3g}: {e} ({f:.0%})" for t, e, f in
                     zip(scan["tau"], scan["n_edges"], scan["positioned_fraction"], strict=True))


def intervention_mask(adata: ad.AnnData, key: str, genes: np.ndarray) -> tuple[sp.csr_matrix, dict]:
    """Which cells were intervened on at which genes of a causal graph, from per-cell labels.

    Parameters
    ----------
    adata
        Cells with GEARS condition labels in ``obs[key]`` (``"ctrl"``, ``"A+ctrl"``, ``"A+B"``).
    key
        The ``obs`` column of the labels (``interventions=`` of :func:`causal_graph`).
    genes
        The graph's genes, in its order (a subset of ``var_names``).

    Reads
    -----
    ``obs[key]`` and ``var_names``.

    Writes
    ------
    Nothing: ``adata`` is unchanged (:func:`causal_graph` records the summary).

    Returns
    -------
    The cells × ``genes`` boolean matrix (sparse CSR), True where the cell's label names that gene as intervened
    on (``intervened=`` of :func:`cape.causal.fit_variational_notears`), and a summary for ``uns``. A target that is
    not a gene of ``adata`` is an error; one that is a gene but not in the graph (not selected, or constant) is
    logged, and its cells keep every equation (nothing to leave out).
    """
    labels, targets = intervention_labels(adata, key)
    conditions = list(targets)
    all_targets = list(dict.fromkeys(g for t in targets.values() for g in t))
    position = {str(g): i for i, g in enumerate(genes)}
    outside = [g for g in all_targets if g not in position]
    if outside:
        logger.warning("interventions: %d intervened gene(s) are not in the causal graph (not selected, or constant), "
                       "e.g. %s; their cells keep every equation (cape.pp.preprocess(..., interventions=%r) selects "
                       "every varying target)", len(outside), outside[0], key)
    code = {c: i for i, c in enumerate(conditions)}
    per_cell = np.array([code[c] for c in labels])
    rows, cols = [], []
    for c, i in code.items():
        cells = np.flatnonzero(per_cell == i)
        for g in targets[c]:
            if g in position:
                rows.append(cells)
                cols.append(np.full(cells.size, position[g]))
    rows = np.concatenate(rows) if rows else np.zeros(0, dtype=int)
    cols = np.concatenate(cols) if cols else np.zeros(0, dtype=int)
    mask = sp.csr_matrix((np.ones(rows.size, dtype=bool), (rows, cols)), shape=(labels.size, genes.size))
    in_graph = [g for g in all_targets if g in position]
    n_cells = int(np.count_nonzero(mask.getnnz(axis=1)))
    record = {"key": key, "n_intervened_cells": n_cells, "n_control_cells": int(np.sum(labels == CONTROL)),
              "n_conditions": int(sum(1 for t in targets.values() if t)), "n_entries_left_out": int(mask.nnz),
              "targets": [str(g) for g in in_graph], "targets_outside_graph": [str(g) for g in outside]}
    if not in_graph:
        logger.warning("interventions: obs[%r] names no gene of the causal graph: the fit uses no intervention", key)
    return mask, record


def _equations_record(fit, X, dag: np.ndarray, genes: np.ndarray, layer: str | None) -> dict:
    """What prediction needs from Step I (see ``equations`` in :func:`causal_graph`), h5ad-serialisable."""
    eq = learned_equations(fit.model, fit.mean, fit.std, X, dag)
    if sp.issparse(X):
        low, high = (np.asarray(m(axis=0).toarray(), dtype=np.float64).ravel() for m in (X.min, X.max))
    else:
        low, high = np.asarray(X.min(0), dtype=np.float64), np.asarray(X.max(0), dtype=np.float64)
    return {**eq.to_dict(), "genes": np.asarray([str(g) for g in genes], dtype=object), "layer": layer or "X",
            "obs_min": low, "obs_max": high, "obs_mean": gene_moments(X)[0]}



@dataclass
class _Selection:
    """The matrix Step I learns from: the selected, non-constant genes of X (or a layer), float32."""

    X: np.ndarray | sp.csr_matrix
    genes: np.ndarray
    dropped: list[str]

    @property
    def n_cells(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_genes(self) -> int:
        return int(self.genes.size)


def _select(adata: ad.AnnData, use_genes, layer: str | None) -> _Selection:
    """The genes of ``use_genes`` in X (or ``layer``), finite, with constant genes dropped (a warning)."""
    if layer is not None and layer not in adata.layers:
        raise CapeInputError(f"layer {layer!r} not found in adata.layers")
    mask = _select_genes(adata, use_genes, layer)
    X = adata.layers[layer] if layer is not None else adata.X
    if X is None:
        raise CapeInputError("adata.X is empty")
    X = X[:, np.flatnonzero(mask)]
    X = sp.csr_matrix(X, dtype=np.float32) if sp.issparse(X) else np.asarray(X, dtype=np.float32)
    if not np.all(np.isfinite(X.data if sp.issparse(X) else X)):
        if sp.issparse(X):
            bad_col = int(X.indices[~np.isfinite(X.data)][0])
        else:
            bad_col = int(np.flatnonzero((~np.isfinite(X)).any(axis=0))[0])
        gene = adata.var_names[np.flatnonzero(mask)][bad_col]
        raise CapeInputError(f"X has NaN or infinite values (e.g. gene {gene!r}): impute or filter them first")
    if X.shape[0] < MIN_CELLS:
        raise CapeInputError(f"causal_graph needs at least {MIN_CELLS} cells, got {X.shape[0]}")
    genes = np.asarray(adata.var_names[mask])
    constant = gene_moments(X)[1] <= 1e-12
    if constant.any():
        names = genes[constant]
        shown = ", ".join(map(str, names[:10])) + (f" … ({len(names)} in all)" if len(names) > 10 else "")
        logger.warning("dropping %d constant gene(s) from the causal graph: %s", len(names), shown)
        X = X[:, np.flatnonzero(~constant)]
    return _Selection(X, genes[~constant], [str(g) for g in genes[constant]])


def _check_size(config: CausalConfig, data: _Selection) -> None:
    """Enough genes (and, for ``parents_mlp``, few enough genes and enough cells); fewer cells than genes warns."""
    n_cells, n_genes = data.n_cells, data.n_genes
    if n_genes < 2:
        raise CapeInputError(f"a causal graph needs at least 2 non-constant genes, got {n_genes}"
                             + (f" ({data.genes[0]})" if n_genes == 1 else ""))
    if n_cells < n_genes:
        logger.warning("fewer cells (%d) than genes (%d): the graph will be poorly determined", n_cells, n_genes)
    if config.model == "parents_mlp" and n_genes > PARENTS_MLP_MAX_GENES:
        raise CapeInputError(f"model='parents_mlp' fits at most {PARENTS_MLP_MAX_GENES} genes, got {n_genes}: select "
                             "fewer (preprocess n_top_genes, use_genes) or use model='variational'")
    if config.model == "parents_mlp" and n_cells < _parents_mlp.min_cells(n_genes):
        most = n_cells // _parents_mlp.min_cells(2) + 1
        raise CapeInputError(f"model='parents_mlp' needs at least {_parents_mlp.min_cells(n_genes)} cells for "
                             f"{n_genes} genes (one per weight of a gene's MLP), got {n_cells}: use at most {most} "
                             "genes (preprocess n_top_genes, use_genes) or model='variational'")
    if config.model != "parents_mlp" and config.rank not in (None, "auto") and config.rank >= n_genes:
        logger.warning("rank %d ≥ number of genes %d: using a dense adjacency instead", config.rank, n_genes)


def _screen(config: CausalConfig, X) -> tuple[tuple | None, np.ndarray | None, dict | None]:
    """The partial-correlation tests on every cell (for the screen, and the budget where it tests every cell), the
    candidate parents and their record."""
    wants_screen = (config.screen == "partial_correlation" and config.model == "variational"
                    and config.rank_for(X.shape[1], screened=True) is None)
    tests = None
    if wants_screen and X.shape[1] <= BUDGET_MAX_GENES:
        tests = partial_correlation_tests(X)
    if not wants_screen:
        return tests, None, None
    candidates = screen_candidates(X, SCREEN_FDR, tests) if tests is not None else None
    fallback = ("every pair is a candidate" if config.rank_for(X.shape[1]) is None else
                f"A = UVᵀ of rank {config.rank_for(X.shape[1])} over every pair")
    record = ({"fdr": SCREEN_FDR, "n_candidate_pairs": int(candidates.sum() // 2)} if candidates is not None else
              {"fallback": "no partial-correlation test (fewer than genes + 10 cells, or more than "
                           f"{BUDGET_MAX_GENES} genes) or no significant pair: {fallback}"})
    return tests, candidates, record


def _fit(config: CausalConfig, X, dev: torch.device, seed: int, intervened, candidates):
    """Step I's model fitted to X (a divergence becomes a one-line error; a collapse raises or warns); the targets'
    own equations left out for their cells when ``config.leave_out_targets``."""
    intervened = intervened if config.leave_out_targets else None
    rank = config.rank_for(X.shape[1], screened=candidates is not None)
    lambda_used = config.lambda_for(rank)
    try:
        if config.model == "parents_mlp":
            fit = fit_parents_mlp(X, lambda_screen=lambda_used * _parents_mlp.LAMBDA_SCREEN,
                                  lambda_sparse=lambda_used * _parents_mlp.LAMBDA_SPARSE, device=dev, seed=seed,
                                  intervened=intervened)
        else:
            fit = fit_variational_notears(X, device=dev, seed=seed, intervened=intervened, candidates=candidates,
                                          **config.notears_options(X.shape[1], screened=candidates is not None))
    except FloatingPointError as err:
        raise CapeInputError(f"{err}; try a smaller lr (got {config.lr}) or check X for extreme values") from err
    if fit.collapsed:
        if config.min_positioned > 0:
            raise CapeInputError(fit.collapse_message)
        logger.warning("%s (min_positioned=0: keeping the graph)", fit.collapse_message)
    return fit


def _edge_budget(X, tests, config: CausalConfig, seed: int) -> tuple[int | None, dict]:
    """``tau="budget"``'s number of edges (None: fall back on the ``"auto"`` rule) and its record; ``tests``: Fisher's
    partial-correlation tests on every cell, if the screen already made them."""
    n_cells, n_genes = X.shape
    fdr = config.budget_fdr
    budget = None
    if n_genes > BUDGET_MAX_GENES:
        record = {"fallback": f"more than {BUDGET_MAX_GENES} genes: tau='auto' rule"}
    else:
        rows = budget_rows(n_cells, n_genes, config.budget_cells, seed)
        if rows is not None:
            logger.info("tau='budget': the partial-correlation test counts on a random %d of the %d cells "
                        "(budget_cells=%d, at least 10 per gene)", rows.size, n_cells, config.budget_cells)
        tested = X if rows is None else X[rows]
        if config.budget_test != "fisher" or rows is not None or tests is None:  # else: the screen's, on every cell
            tests = budget_tests(tested, config.budget_test)
        budget = None if tests is None else edge_budget(tested, fdr, tests)
        cells = {"test": config.budget_test, "n_cells_tested": n_cells if rows is None else int(rows.size),
                 "cells_tested": "all" if rows is None else f"random subset (seed {seed})",
                 "n_pairs_tested": 0 if tests is None else int(np.isfinite(tests[1]).sum())}
        if budget is None:
            record = {"fallback": f"fewer than genes + 10 cells ({n_cells} for {n_genes} genes) for the "
                                  "partial-correlation test: tau='auto' rule"}
        elif budget == 0:
            record = {"n_pairs": 0, "fdr": fdr, **cells,
                      "fallback": f"no gene pair has a significant partial correlation "
                                  f"({BUDGET_TEST_NAMES[config.budget_test]}, "
                                  f"FDR {fdr:g}, {cells['n_cells_tested']} cells, {n_genes} genes, "
                                  f"{cells['n_pairs_tested']} pairs tested): tau='auto' rule, on weak evidence"}
            budget = None
        else:
            record = {"n_pairs": int(budget), "fdr": fdr, **cells}
    if budget is None:
        (logger.warning if record.get("n_pairs") == 0 else logger.info)("tau='budget': %s", record["fallback"])
    return budget, record


@dataclass
class _Graph:
    """The thresholded DAG and what thresholding did."""

    dag: np.ndarray
    removed: int
    tau_used: float
    tau_rule: str
    n_positioned: int
    max_weight: float
    scan: dict[str, np.ndarray]

    @property
    def n_edges(self) -> int:
        return int(np.count_nonzero(self.dag))


def _threshold(A: np.ndarray, config: CausalConfig, budget: int | None, n_cells: int) -> _Graph:
    """A thresholded at τ (fixed or by rule) and made a DAG; too few genes positioned raises or warns."""
    n_genes = A.shape[0]
    tau_used, tau_rule = choose_tau(A, config.tau, config.min_positioned, budget)
    dag, removed = make_dag(A, tau_used)
    if removed:
        logger.info("removed %d edge(s) to break cycles left after thresholding", removed)
    n_positioned = int(((dag != 0).any(axis=0) | (dag != 0).any(axis=1)).sum())
    graph = _Graph(dag, int(removed), float(tau_used), tau_rule, n_positioned,
                   float(np.abs(A).max()) if A.size else 0.0, _threshold_scan(A, (*SCAN_TAUS, tau_used)))
    logger.info("Step I: %d edges, %d of %d genes positioned at tau=%.3g (%s); largest weight %.3g; "
                "edges (positioned genes) by tau: %s", graph.n_edges, n_positioned, n_genes, tau_used, tau_rule,
                graph.max_weight, _format_scan(graph.scan))
    if tau_rule == "budget":
        logger.info("tau='budget': %d gene pairs have a significant partial correlation (%s, BH %g): kept the "
                    "%d heaviest edges of the DAG (tau=%.3g)", budget, BUDGET_TEST_NAMES[config.budget_test],
                    config.budget_fdr, graph.n_edges, tau_used)
    if n_positioned < config.min_positioned * n_genes:
        needed = tau_positioning(A, config.min_positioned)
        reason = (f"Step I kept {graph.n_edges} edges ({n_positioned / n_genes:.0%} of {n_genes} genes positioned) at "
                  f"tau={tau_used:.3g}; the largest weight is {graph.max_weight:.2g}")
        if tau_rule.startswith("auto"):
            raise CapeInputError(
                f"{reason}, and positioning {config.min_positioned:.0%} of the genes would need tau≤{needed:.2g}, "
                f"below the noise floor {AUTO_TAU_FLOOR}: use more cells ({n_cells} for {n_genes} genes), fewer "
                f"genes (preprocess n_top_genes), or a fixed tau to accept such weak edges")
        budget_note = (" (tau=budget keeps the edges the data support, not a share of the genes)"
                       if tau_rule == "budget" else "")
        if needed >= AUTO_TAU_FLOOR:
            logger.warning("%s: use tau=auto or tau≤%.2g to position %.0f%% of the genes, or more cells%s", reason,
                           needed, 100 * config.min_positioned, budget_note)
        else:  # no threshold would do it: advising tau=auto or a smaller tau would only fail or add noise
            logger.warning("%s: no threshold above the noise floor %g positions %.0f%% of the genes; more cells (%d "
                           "for %d genes) or fewer genes (preprocess n_top_genes) give Step I more to go on%s",
                           reason, AUTO_TAU_FLOOR, 100 * config.min_positioned, n_cells, n_genes, budget_note)
    return graph


def _orient(config: CausalConfig, graph: _Graph, X, intervened, genes: np.ndarray) -> dict | None:
    """Turn ``graph``'s edges that the interventions contradict (:func:`~cape.causal.orient_by_shifts`); its record
    (``None`` without labels or with ``orient_by_shifts`` off)."""
    if intervened is None or not config.orient_by_shifts:
        return None
    P = shift_tests(X, intervened)
    n_tested = int(np.isfinite(P).sum())
    result = orient_by_shifts(graph.dag, descendant_evidence(P, ORIENT_FDR), n_tested)
    graph.dag = result.dag
    graph.n_positioned = int(((result.dag != 0).any(axis=0) | (result.dag != 0).any(axis=1)).sum())
    if n_tested == 0:
        logger.warning("orient_by_shifts: no test possible (needs %d control cells and %d cells per intervened gene): "
                       "directions left as fitted", MIN_SHIFT_CELLS, MIN_SHIFT_CELLS)
    else:
        logger.info("orient_by_shifts: %d of %d (intervened gene, gene) pairs shifted (BH %g); %d edge(s) turned, %d "
                    "removed to break cycles; %d of %d edges point as the interventions say", result.n_shifted_pairs,
                    n_tested, ORIENT_FDR, result.n_turned, result.n_removed, result.n_supported, graph.n_edges)
    return result.record(ORIENT_FDR, genes)


def _params_record(config: CausalConfig, *, device, seed: int, use_genes, layer, key_added, interventions) -> dict:
    """``params`` of the record: the options as given (``"auto"``/``"dense"``/``"none"`` for None)."""
    rank = config.rank
    return {"rank": "dense" if rank is None else rank if rank == "auto" else int(rank), "tau": config.tau,
            "budget_fdr": float(config.budget_fdr), "budget_test": config.budget_test,
            "budget_cells": "all" if config.budget_cells is None else int(config.budget_cells),
            "lambda_sparse": "auto" if config.lambda_sparse is None else float(config.lambda_sparse),
            "epochs": int(config.epochs), "batch_size": int(config.batch_size), "lr": float(config.lr),
            "device": str(device), "seed": int(seed),
            "use_genes": use_genes if isinstance(use_genes, str) else "custom", "layer": layer or "X",
            "key_added": key_added, "h_every": "auto" if config.h_every is None else int(config.h_every),
            "min_positioned": float(config.min_positioned), "model": config.model,
            "interventions": interventions or "none", "screen": config.screen,
            "leave_out_targets": bool(config.leave_out_targets), "orient_by_shifts": bool(config.orient_by_shifts)}


def _record(params: dict, config: CausalConfig, data: _Selection, fit, graph: _Graph, extra: dict,
            screened: bool) -> dict:
    """``uns["cape"]["causal_graph"]``: the parameters, the fit's bookkeeping and the graph's figures."""
    rank_used = config.rank_for(data.n_genes, screened)
    record = {
        "params": params, "rank_used": "dense" if rank_used is None else int(rank_used),
        "sparse_adjacency": bool(fit.sparse),
        "lambda_sparse_used": float(config.lambda_for(rank_used)), "device_used": fit.device,
        "n_cells": data.n_cells, "n_genes": data.n_genes, "n_edges": graph.n_edges, "tau_used": graph.tau_used,
        "tau_rule": graph.tau_rule, "max_weight": graph.max_weight, "n_positioned": graph.n_positioned,
        "positioned_fraction": float(graph.n_positioned / data.n_genes), "threshold_scan": graph.scan,
        "removed_cycle_edges": graph.removed, "dropped_constant_genes": data.dropped,
        "epochs_run": int(fit.epochs_run), "converged": bool(fit.converged), "collapsed": bool(fit.collapsed),
        "peak_weight": float(fit.peak_weight), "h_every": int(fit.h_every),
        "recon_fraction": float(fit.recon_fraction), "compiled_mlp": bool(fit.compiled_mlp),
        "history": {k: np.asarray(v, dtype=np.float64) for k, v in fit.history.items()},
        "fit_seconds": float(fit.wall_time),
    }
    record.update({k: v for k, v in extra.items() if v is not None})
    if fit.rho_max is not None:  # the variational model's augmented Lagrangian (parents_mlp has none)
        record["rho_max"] = float(fit.rho_max)
    return record


def causal_graph(adata: ad.AnnData, config: CausalConfig | None = None, *,
                 use_genes: str | Sequence[str] | np.ndarray | None = "cape_used", layer: str | None = None,
                 interventions: str | None = None, key_added: str = DAG_KEY, copy: bool = False,
                 device: str = "auto", seed: int | None = 0, **options) -> ad.AnnData | None:
    """Learn the causal gene graph (CAPE Step I: variational NOTEARS, paper Sec. 3.3).

    Parameters
    ----------
    adata
        Cells × genes; X (or ``layer``) preprocessed (e.g. log-normalised), dense or sparse, no NaN.
    config
        Step I's options (:class:`~cape.causal.CausalConfig`: ``model``, ``rank``, ``tau``, ``min_positioned``,
        ``lambda_sparse``, ``epochs``, ``batch_size``, ``lr``, ``h_every``, ``screen``; see it for the τ rules
        ``"budget"`` and ``"auto"``); default: the workflow's defaults.
    use_genes
        Boolean ``var`` column (default ``"cape_used"``; all genes when it is absent), a boolean mask, a list
        of gene names, or ``None`` for all genes. Constant genes among them are dropped with a warning.
    layer
        Use ``adata.layers[layer]`` instead of X.
    interventions
        ``obs`` column of per-cell intervention labels in GEARS form (``"ctrl"``, ``"A+ctrl"``, ``"A+B"``): for each
        perturbed cell the perturbed gene's own structural equation is left out of the likelihood (SDCD, DCD-FG;
        ``leave_out_targets``), and kept edges that the genes' shifts against the ``"ctrl"`` cells contradict are
        turned (``orient_by_shifts``). ``None`` (default): every cell is observational.
    key_added
        ``varp`` key of the result; its record goes to ``uns["cape"]["causal_graph"]`` for the default key
        ``"cape_dag"`` and to ``uns["cape"][key_added]`` for any other, so that graphs under two keys keep
        their own records.
    copy
        Return a modified copy instead of writing into ``adata``.
    device
        ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``.
    seed
        Seeds initialisation, minibatch order and sampling (same seed, same graph on CPU).
    **options
        Fields of :class:`~cape.causal.CausalConfig` by name (e.g. ``rank=None, tau=0.2``), replacing those of
        ``config``; another name raises :class:`~cape.CapeInputError`.

    Reads
    -----
    ``X`` (or ``layers[layer]``) and the gene selection ``var["cape_used"]`` (``use_genes``).

    Writes
    ------
    - ``varp["cape_dag"]`` (``key_added``): CSR float32 n_vars × n_vars, ``A[i, j] ≠ 0`` means gene i → gene j,
      always a DAG, zero outside the genes used;
    - ``var["cape_used"]``: the genes that took part in the graph;
    - ``uns["cape"]["causal_graph"]`` (see ``key_added``): ``params``; the fit (``history`` per epoch, ``epochs_run``,
      ``converged``, ``collapsed``, ``peak_weight``, ``rank_used``, ``sparse_adjacency``, ``lambda_sparse_used``,
      ``rho_max``, timings); the graph (``n_edges``, ``tau_used``, ``tau_rule``, ``max_weight``, ``n_positioned``,
      ``positioned_fraction``, ``removed_cycle_edges``, ``dropped_constant_genes``, ``threshold_scan`` at
      :data:`SCAN_TAUS`); ``edge_budget``, ``screening``, ``interventions`` and ``orientation`` (tests, shifted
      pairs, supported and turned edges) where they applied; and ``equations``, the fitted structural equations
      that :func:`cape.tl.predict_intervention` evaluates (:class:`cape.causal.StructuralEquations`).

    Returns
    -------
    ``None``, or the copy when ``copy=True``.

    Raises
    ------
    CapeInputError
        An unknown option or an invalid value (see :class:`~cape.causal.CausalConfig`), NaN/inf values, fewer than
        :data:`MIN_CELLS` cells, fewer than two usable genes, or (``tau="auto"``) fewer than ``min_positioned`` of
        the genes positioned by weights above :data:`AUTO_TAU_FLOOR`; a collapsed fit (A driven to almost nothing
        after it had found weights, unless ``min_positioned=0``, then it warns); a missing ``interventions`` column,
        a missing label or one naming a gene not in ``var_names``. Fewer cells than genes only warns.
    """
    start = time.perf_counter()
    config = with_options(CausalConfig, config, options, "causal_graph")
    data = _select(adata, use_genes, layer)
    adata = adata.copy() if copy else adata
    intervened, intervention_record = (None, None) if interventions is None else \
        intervention_mask(adata, interventions, data.genes)
    _check_size(config, data)
    tests, candidates, screen_record = _screen(config, data.X)
    seed = seed_everything(resolve_seed(seed))
    fit = _fit(config, data.X, resolve_device(device), seed, intervened, candidates)
    budget, budget_record = _edge_budget(data.X, tests, config, seed) if config.tau == "budget" else (None, None)
    graph = _threshold(fit.adjacency, config, budget, data.n_cells)
    orientation = _orient(config, graph, data.X, intervened, data.genes)
    rows, cols = np.nonzero(graph.dag)
    index = adata.var_names.get_indexer(data.genes)
    adata.varp[key_added] = sp.csr_matrix((graph.dag[rows, cols].astype(np.float32), (index[rows], index[cols])),
                                          shape=(adata.n_vars, adata.n_vars))
    adata.var["cape_used"] = adata.var_names.isin(data.genes)
    params = _params_record(config, device=device, seed=seed, use_genes=use_genes, layer=layer,
                            key_added=key_added, interventions=interventions)
    record = _record(params, config, data, fit, graph, {
        "interventions": intervention_record, "edge_budget": budget_record, "screening": screen_record,
        "orientation": orientation,
        # a CausalFit built without its model (e.g. from a stored adjacency) has no equations
        "equations": None if fit.model is None else _equations_record(fit, data.X, graph.dag, data.genes, layer)},
        screened=candidates is not None)
    record["wall_time"] = float(time.perf_counter() - start)
    record["versions"] = {"cape": str(__version__), "torch": str(torch.__version__)}
    adata.uns.setdefault("cape", {})[step_key("causal_graph", key_added, DAG_KEY)] = record
    logger.info("causal graph: %d genes, %d edges (%d removed to break cycles), %.1f s",
                data.n_genes, graph.n_edges, graph.removed, record["wall_time"])
    return adata if copy else None
