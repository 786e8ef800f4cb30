"""Step I's pipeline over arrays: from a cells × genes matrix to the weighted causal DAG and its record.

The stages, each a small function here over the modules of :mod:`cape.causal`:

1. checks (finite values, enough cells, constant genes dropped with a warning, the tests' memory;
   :func:`check_matrix`, :func:`check_size`, :func:`check_memory`);
2. candidate parents from partial correlations (:func:`screen`, the dense A's screen);
3. the fit (:func:`fit`: :func:`~cape.causal.fit_variational_notears` or :func:`~cape.causal.fit_parents_mlp`),
   with a collapse turned into an error;
4. the edge budget (:func:`edge_budget_for`, ``tau="budget"``), which pairs it keeps (:func:`budget_pairs`, by the
   configured pair ranking, made a DAG by :func:`budget_dag`), the threshold and the cycle breaking
   (:func:`threshold`);
5. the orientation: by the interventions' downstream shifts with labels (:func:`orient`), by the likelihood without
   (:func:`orient_without_labels`);
6. the fitted structural equations and the record (:func:`learn_causal_graph` returns them in a
   :class:`CausalGraph`).

:func:`cape.tl.causal_graph` is the AnnData adapter over :func:`learn_causal_graph` (gene selection, labels, where
the results go); the benchmarks call the same stages.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp
import torch

from .._errors import CapeInputError
from .._settings import physical_memory, resolve_device, seed_everything
from . import parents_mlp as _parents_mlp
from .causal_config import CausalConfig
from .confidence import SOLID_CONFIDENCE, EdgeConfidence, cap_unsupported, edge_confidence
from .intervention_orientation import (
    MIN_SHIFT_CELLS,
    ORIENT_FDR,
    descendant_evidence,
    orient_by_shifts,
    shift_tests,
)
from .likelihood_orientation import LIKELIHOOD_ORIENT_LEVEL, orient_by_likelihood
from .pair_ranking import (
    PAIR_RANKING_WORDS,
    pair_ranking_for,
    pair_score_matrix,
    ranked_pairs,
    shrunk_partial_correlations,
    top_pairs_oriented,
)
from .parents_mlp import fit_parents_mlp
from .postprocess import (
    AUTO_TAU_FLOOR,
    BUDGET_MIN_EXTRA_CELLS,
    BUDGET_TEST_NAMES,
    SCREEN_FDR,
    BudgetCount,
    budget_rows,
    budget_tests,
    choose_tau,
    count_budget,
    make_dag,
    orient_acyclic,
    partial_correlation_tests,
    positioned_genes,
    screen_candidates,
    tau_positioning,
)
from .structural_equations import learned_equations
from .trainer import MIN_CELLS, CausalFit, _fits_on_device, fit_variational_notears, gene_moments

__all__ = ["BUDGET_MAX_GENES", "DECOY_WARNING_SHARE", "PARENTS_MLP_MAX_GENES", "SCAN_TAUS", "CausalGraph", "Graph",
           "budget_dag", "budget_pairs", "check_matrix", "check_memory", "check_size", "edge_budget_for", "fit",
           "learn_causal_graph", "linalg_bytes", "orient", "screen", "threshold"]

logger = logging.getLogger("cape")

#: Most genes the partial-correlation tests are run on (the screen's candidates, ``tau="budget"``'s count, the shrunk
#: ranking): M×M inverses, whose float64 arrays grow with the square of the genes (docs/benchmarks/step1_scale.md).
#: Beyond, no candidates (A = UVᵀ over every pair) and ``"auto"``'s rule.
BUDGET_MAX_GENES = 10000
#: What a user beyond :data:`BUDGET_MAX_GENES` genes can do instead of the unscreened fit (A = UVᵀ over every pair,
#: whose L1 starves weak edges), with the limit to fill in.
SCREENED_GENES_REMEDY = ("at most {} genes (preprocess n_top_genes), where Step I screens candidate pairs and fits "
                         "them densely")
#: ``tau="budget"`` warns when the test calls more than this share of its significant pairs again on a copy of the
#: cells with every gene permuted (:func:`~cape.causal.postprocess.decoy_count`): its null does not fit the data.
DECOY_WARNING_SHARE = 0.1
PARENTS_MLP_MAX_GENES = _parents_mlp.MAX_GENES
#: Thresholds at which the record's ``threshold_scan`` counts surviving edges and genes.
SCAN_TAUS = (0.2, 0.1, 0.05, 0.02, 0.01)


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


def equations_record(fit: CausalFit, X, dag: np.ndarray, genes: np.ndarray) -> dict:
    """What prediction needs from Step I: the fitted structural equations on ``dag``
    (:class:`~cape.causal.StructuralEquations`), the genes, and each gene's observed range and mean; h5ad-ready."""
    eq = learned_equations(fit.model, fit.mean, fit.std, X, dag)
    if sp.issparse(X):
        low, high = (np.asarray(m(axis=0).toarray(), dtype=np.float64).ravel() for m in (X.min, X.max))
    else:
        low, high = np.asarray(X.min(0), dtype=np.float64), np.asarray(X.max(0), dtype=np.float64)
    return {**eq.to_dict(), "genes": np.asarray([str(g) for g in genes], dtype=object),
            "obs_min": low, "obs_max": high, "obs_mean": gene_moments(X)[0]}


def check_matrix(X, genes) -> tuple[np.ndarray | sp.csr_matrix, np.ndarray, list[str]]:
    """X as float32 (dense, or CSR), refused with NaN or infinite values or fewer than :data:`MIN_CELLS` cells;
    constant genes dropped with a warning. Returns the matrix, its genes and the names of the dropped ones."""
    genes = np.asarray(genes)
    X = sp.csr_matrix(X, dtype=np.float32) if sp.issparse(X) else np.asarray(X, dtype=np.float32)
    if X.ndim != 2 or X.shape[1] != genes.size:
        raise CapeInputError(f"X must be cells × genes with {genes.size} gene(s), got shape {X.shape}")
    if not np.all(np.isfinite(X.data if sp.issparse(X) else X)):
        if sp.issparse(X):
            bad_col = int(X.indices[~np.isfinite(X.data)][0])
        else:
            bad_col = int(np.flatnonzero((~np.isfinite(X)).any(axis=0))[0])
        raise CapeInputError(f"X has NaN or infinite values (e.g. gene {str(genes[bad_col])!r}): impute or filter them "
                             "first")
    if X.shape[0] < MIN_CELLS:
        raise CapeInputError(f"causal_graph needs at least {MIN_CELLS} cells, got {X.shape[0]}")
    constant = gene_moments(X)[1] <= 1e-12
    if constant.any():
        names = genes[constant]
        shown = ", ".join(map(str, names[:10])) + (f" … ({len(names)} in all)" if len(names) > 10 else "")
        logger.warning("dropping %d constant gene(s) from the causal graph: %s", len(names), shown)
        X = X[:, np.flatnonzero(~constant)]
    return X, genes[~constant], [str(g) for g in genes[constant]]


def check_size(config: CausalConfig, X, genes: np.ndarray) -> None:
    """Enough genes (and, for ``parents_mlp``, few enough genes and enough cells); fewer cells than genes warns."""
    n_cells, n_genes = X.shape
    if n_genes < 2:
        raise CapeInputError(f"a causal graph needs at least 2 non-constant genes, got {n_genes}"
                             + (f" ({genes[0]})" if n_genes == 1 else ""))
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


def linalg_bytes(n_cells: int, n_genes: int) -> int:
    """Device memory that the tests' and the shrinkage's float64 arrays take at most: four cells × genes arrays (the
    data, centred, squared and its square) and ten genes × genes ones. On CUDA that algebra runs on the card where this
    fits beside what is there (on the CPU, and where it does not fit, it stays NumPy's)."""
    return 8 * (4 * n_cells * n_genes + 10 * n_genes * n_genes)


def _wants_screen(config: CausalConfig, n_genes: int) -> bool:
    """Whether the fit is one the partial-correlation screen applies to (a dense A under the variational model)."""
    return (config.screen == "partial_correlation" and config.model == "variational"
            and config.rank_for(n_genes, screened=True) is None)


def check_memory(config: CausalConfig, X, linalg_device=None) -> None:
    """Refuse, before any work, partial-correlation tests whose float64 arrays (:func:`linalg_bytes`) exceed the
    machine's physical memory where they run on the host (``linalg_device`` ``None``): they would end in the system
    killing the process, without a message. Nothing is checked where the system does not say its memory."""
    n_cells, n_genes = X.shape
    tests = ((config.tau == "budget" or config.edge_confidence or _wants_screen(config, n_genes))
             and linalg_device is None and 2 <= n_genes <= BUDGET_MAX_GENES
             and n_cells >= n_genes + BUDGET_MIN_EXTRA_CELLS)
    memory = physical_memory() if tests else None
    if memory is not None and linalg_bytes(n_cells, n_genes) > memory:
        raise CapeInputError(f"Step I's partial-correlation tests on {n_cells} cells × {n_genes} genes need about "
                             f"{linalg_bytes(n_cells, n_genes) / 1e9:.2g} GB, more than this machine's "
                             f"{memory / 1e9:.2g} GB: use fewer genes (preprocess n_top_genes; the need grows with "
                             "their square), fewer cells, or a GPU that holds them")


def screen(config: CausalConfig, X, linalg_device=None) -> tuple[tuple | None, np.ndarray | None, dict | None]:
    """The partial-correlation tests on every cell (for the screen, and the budget where it tests every cell), the
    candidate parents and their record; ``linalg_device``: where the tests' linear algebra runs (``None``: NumPy)."""
    wants_screen = _wants_screen(config, X.shape[1])
    tests = None
    if wants_screen and X.shape[1] <= BUDGET_MAX_GENES:
        tests = partial_correlation_tests(X, linalg_device)
    if not wants_screen:
        return tests, None, None
    candidates = screen_candidates(X, SCREEN_FDR, tests) if tests is not None else None
    fallback = ("every pair is a candidate" if config.rank_for(X.shape[1]) is None else
                f"A = UVᵀ of rank {config.rank_for(X.shape[1])} over every pair")
    record = ({"fdr": SCREEN_FDR, "n_candidate_pairs": int(candidates.sum() // 2)} if candidates is not None else
              {"fallback": "no partial-correlation test (fewer than genes + 10 cells, or more than "
                           f"{BUDGET_MAX_GENES} genes) or no significant pair: {fallback}"})
    return tests, candidates, record


def fit(config: CausalConfig, X, dev: torch.device, seed: int, intervened, candidates) -> CausalFit:
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
        message = fit.collapse_message
        if config.rank == "auto" and config.model == "variational" and X.shape[1] > BUDGET_MAX_GENES:
            # Too many genes to screen, so A = UVᵀ over every pair: the screened dense fit is the remedy that works.
            message += f", or use {SCREENED_GENES_REMEDY.format(BUDGET_MAX_GENES)}"
        if config.min_positioned > 0:
            raise CapeInputError(message)
        logger.warning("%s (min_positioned=0: keeping the graph)", message)
    return fit


def edge_budget_for(X, tests, config: CausalConfig, seed: int, linalg_device=None
                    ) -> tuple[int | None, dict, tuple | None]:
    """``tau="budget"``'s number of edges (None: fall back on the ``"auto"`` rule), its record and the tests it
    counted ((pairs, p) of every gene pair, or ``None`` where it could not test); ``tests``: Fisher's
    partial-correlation tests on every cell, if the screen already made them; ``linalg_device`` as for
    :func:`screen`.

    The count is the pairs significant at ``budget_fdr`` less those the same test calls on a copy of the cells with
    every gene permuted on its own (:func:`~cape.causal.postprocess.count_budget`, seeded by ``seed``): where the
    test holds its level that copy adds nothing, and where it does not (genes detected in a handful of cells) the
    budget does not take the test's false calls for edges. Where that count is below the number of genes, the pairs
    significant at ``budget_fill_fdr`` raise it towards one per gene (:func:`~cape.causal.postprocess.fill_budget`).
    """
    n_cells, n_genes = X.shape
    fdr = config.budget_fdr
    if n_genes > BUDGET_MAX_GENES:
        record = {"fallback": f"more than {BUDGET_MAX_GENES} genes: tau='auto' rule"}
        logger.info("tau='budget': %s", record["fallback"])
        return None, record, None
    rows = budget_rows(n_cells, n_genes, config.budget_cells, seed)
    if rows is not None:
        logger.info("tau='budget': the partial-correlation test counts on a random %d of the %d cells "
                    "(budget_cells=%d, at least 10 per gene)", rows.size, n_cells, config.budget_cells)
    tested = X if rows is None else X[rows]
    # The screen's Fisher tests were made on every cell: reused where the budget tests every cell too.
    tests = budget_tests(tested, config.budget_test, fisher=tests if rows is None else None, device=linalg_device)
    count = (None if tests is None else
             count_budget(tested, tests, fdr, config.budget_fill_fdr, config.budget_test, seed, linalg_device))
    if count is None:
        record = {"fallback": f"fewer than genes + 10 cells ({n_cells} for {n_genes} genes) for the "
                              "partial-correlation test: tau='auto' rule"}
        logger.info("tau='budget': %s", record["fallback"])
        return None, record, tests
    _warn_on_decoys(count, config.budget_test)
    cells = {"test": config.budget_test, "n_cells_tested": n_cells if rows is None else int(rows.size),
             "cells_tested": "all" if rows is None else f"random subset (seed {seed})",
             "n_pairs_tested": int(np.isfinite(tests[1]).sum()),
             "n_pairs_significant": count.significant, "n_pairs_permuted": count.permuted,
             **({} if count.significant_fill is None else
                {"fill_fdr": config.budget_fill_fdr, "n_pairs_significant_fill": count.significant_fill,
                 "n_pairs_permuted_fill": count.permuted_fill, "n_pairs_strict": count.strict,
                 "filled": count.filled})}
    if count.n_pairs > 0:
        if count.filled:
            logger.info("tau='budget': %d gene pairs pass at FDR %g, fewer than the %d genes: %d kept, up to one "
                        "per gene from the %d that pass at FDR %g given the cell states too (budget_fill_fdr)",
                        count.strict, fdr, n_genes, count.n_pairs, count.significant_fill - count.permuted_fill,
                        config.budget_fill_fdr)
        return count.n_pairs, {"n_pairs": count.n_pairs, "fdr": fdr, **cells}, tests
    # nothing passed at either rate: say what the looser one (the fill's, where on) found
    significant, permuted, rate, given = ((count.significant, count.permuted, fdr, "") if count.significant_fill is None
                                          else (count.significant_fill, count.permuted_fill, config.budget_fill_fdr,
                                                " and given the cell states"))
    found = (f"{significant} gene pairs have a significant partial correlation, no more than the "
             f"{permuted} called on a copy of the cells with every gene permuted" if permuted
             else "no gene pair has a significant partial correlation")
    record = {"n_pairs": 0, "fdr": fdr, **cells,
              "fallback": f"{found} ({BUDGET_TEST_NAMES[config.budget_test]}{given}, FDR {rate:g}, "
                          f"{cells['n_cells_tested']} cells, {n_genes} genes, {cells['n_pairs_tested']} pairs "
                          "tested): tau='auto' rule, on weak evidence"}
    logger.warning("tau='budget': %s", record["fallback"])
    return None, record, tests


def _warn_on_decoys(count: BudgetCount, test: str) -> None:
    """Warn where the permuted copy, in which no pair depends, has many of the budget's significant calls."""
    if count.permuted > DECOY_WARNING_SHARE * count.significant:
        logger.warning("tau='budget': %s calls %d gene pairs significant on a copy of the cells with every gene "
                       "permuted on its own (no pair depends there), against %d on the data; the budget counts "
                       "the difference, %d. The test's null does not fit these genes, most often because many "
                       "are detected in a few cells: leave those out (cape.pp.preprocess(min_cells=20), the "
                       "workflow's preprocess.min_cells)", BUDGET_TEST_NAMES[test], count.permuted,
                       count.significant, count.strict)


@dataclass
class Graph:
    """The thresholded DAG and what thresholding did."""

    dag: np.ndarray
    removed: int
    tau_used: float
    tau_rule: str
    n_positioned: int
    max_weight: float
    scan: dict[str, np.ndarray]
    #: Symmetric M×M scores by which a pair ranking chose the pairs (higher first); ``None`` where the fit's weights
    #: alone decided (A's own max(|A_ij|, |A_ji|), not stored a second time)
    pair_scores: np.ndarray | None = None
    #: Edges kept against the fit's heavier direction, which would have closed a cycle (:func:`budget_dag`)
    turned: int = 0

    @property
    def n_edges(self) -> int:
        return int(np.count_nonzero(self.dag))


def budget_pairs(A: np.ndarray, budget: int, ranked: tuple | None, judged: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """The budget's edges before the cycles are broken, where a pair ranking decides (:mod:`cape.causal.pair_ranking`):
    the ``budget`` gene pairs scored highest in ``ranked`` ((pairs, scores) of :func:`cape.causal.ranked_pairs`),
    each in the fit's heavier direction with its weight, and the pairs' score matrix; ``None`` without ``ranked``.

    ``judged``: one flag per pair of ``ranked``, the pairs the budget's test could judge (its p-value is not NaN);
    only those are kept, as only those were counted (a pair with a gene detected in a handful of cells is not). The
    score matrix keeps every pair's score."""
    if ranked is None:
        return None
    pairs, scores = ranked
    keep = np.ones(scores.size, dtype=bool) if judged is None else np.asarray(judged, dtype=bool)
    if keep.size != scores.size:
        raise ValueError(f"{keep.size} judged flags for {scores.size} ranked pairs")
    return (top_pairs_oriented(A, (pairs[0][keep], pairs[1][keep]), scores[keep], budget, AUTO_TAU_FLOOR),
            pair_score_matrix(A.shape[0], pairs, scores))


def budget_dag(A: np.ndarray, budget: int, ranked: tuple | None, judged: np.ndarray | None = None
               ) -> tuple[np.ndarray, int, int, np.ndarray] | None:
    """The budget's DAG where a pair ranking decides: (DAG, pairs its cycles cost, edges turned, the pairs' score
    matrix), or ``None`` without ``ranked``.

    The ``budget`` best-ranked pairs (:func:`budget_pairs`), each in the fit's heavier direction, hold cycles where
    the fit's directions disagree with each other; breaking them (:func:`~cape.causal.make_dag`) keeps n of the pairs
    and would let the fit's weights choose which. The ranking chooses instead: its n best pairs, made a DAG by
    turning each edge whose direction would close a cycle of heavier ones (:func:`~cape.causal.orient_acyclic`), or
    dropping it where the fit gives the other direction no weight. The count of pairs stays the one cycle breaking
    leaves: keeping all ``budget`` pairs, turned, was worse where the budget counts more pairs than the network has
    (docs/benchmarks/count_panel.md).
    """
    chosen_pairs = budget_pairs(A, budget, ranked, judged)
    if chosen_pairs is None:
        return None
    chosen, scores = chosen_pairs
    dag, removed = make_dag(chosen, 0.0)
    if not removed:
        return dag, 0, 0, scores
    best = budget_pairs(A, int(np.count_nonzero(dag)), ranked, judged)[0]
    dag, turned, _ = orient_acyclic(best, A, AUTO_TAU_FLOOR)
    return dag, int(np.count_nonzero(chosen)) - int(np.count_nonzero(dag)), turned, scores


def threshold(A: np.ndarray, config: CausalConfig, budget: int | None, n_cells: int,
              ranked: tuple | None = None, judged: np.ndarray | None = None) -> Graph:
    """A thresholded at τ (fixed or by rule) and made a DAG; too few genes positioned raises or warns.

    Under the budget with a pair ranking other than the fit's (``config.pair_ranking``) and its ``ranked`` pairs
    ((pairs, scores) of :func:`cape.causal.ranked_pairs`), the kept pairs are :func:`budget_pairs`' (among the pairs
    ``judged`` by the budget's test, where given); τ is then the lightest kept weight (lighter edges of A are kept
    where the ranking puts their pair high, heavier ones left out where it does not).
    """
    n_genes = A.shape[0]
    tau_used, tau_rule = choose_tau(A, config.tau, config.min_positioned, budget)
    ranking_decides = tau_rule == "budget" and config.pair_ranking != "fit"
    chosen = budget_dag(A, budget, ranked, judged) if ranking_decides else None
    pair_scores, turned = None, 0
    if chosen is None:
        dag, removed = make_dag(A, tau_used)
    else:
        dag, removed, turned, pair_scores = chosen
        kept = np.abs(dag[dag != 0])
        tau_used = float(kept.min()) if kept.size else tau_used
    if removed:
        logger.info("removed %d edge(s) to break cycles left after thresholding", removed)
    if turned:
        logger.info("turned %d edge(s) whose fitted direction would close a cycle of heavier edges", turned)
    n_positioned = int(((dag != 0).any(axis=0) | (dag != 0).any(axis=1)).sum())
    graph = Graph(dag, int(removed), float(tau_used), tau_rule, n_positioned,
                   float(np.abs(A).max()) if A.size else 0.0, _threshold_scan(A, (*SCAN_TAUS, tau_used)),
                   pair_scores, int(turned))
    # Under a pair ranking no single τ cuts A into the graph: name the lightest kept weight instead.
    at = (f"at tau={tau_used:.3g}" if chosen is None else f"with weights down to {tau_used:.3g}")
    logger.info("Step I: %d edges, %d of %d genes positioned %s (%s); largest weight %.3g; A's edges (positioned "
                "genes) by tau: %s", graph.n_edges, n_positioned, n_genes, at, tau_rule, graph.max_weight,
                _format_scan(graph.scan))
    if tau_rule == "budget":
        kept = (f"highest-scoring pairs ({PAIR_RANKING_WORDS.get(config.pair_ranking, 'as ranked')})"
                if chosen is not None else "heaviest edges of the DAG")
        logger.info("tau='budget': %d gene pairs have a significant partial correlation (%s, BH %g): kept the "
                    "%d %s (lightest weight %.3g)", budget, BUDGET_TEST_NAMES[config.budget_test],
                    config.budget_fdr, graph.n_edges, kept, tau_used)
    if n_positioned < config.min_positioned * n_genes:
        needed = tau_positioning(A, config.min_positioned)
        reason = (f"Step I kept {graph.n_edges} edges ({n_positioned / n_genes:.0%} of {n_genes} genes positioned) "
                  f"{at}; the largest weight is {graph.max_weight:.2g}")
        if tau_rule.startswith("auto"):
            # Beyond BUDGET_MAX_GENES the fit is A = UVᵀ over every pair, whose L1 starves weak edges: the screened
            # dense path below that line is the remedy that works.
            fewer = (SCREENED_GENES_REMEDY.format(BUDGET_MAX_GENES) if n_genes > BUDGET_MAX_GENES
                     else "fewer genes (preprocess n_top_genes)")
            raise CapeInputError(
                f"{reason}, and positioning {config.min_positioned:.0%} of the genes would need tau≤{needed:.2g}, "
                f"below the noise floor {AUTO_TAU_FLOOR}: use {fewer}, more cells (this run: {n_cells} for "
                f"{n_genes} genes), or a fixed tau to accept such weak edges")
        budget_note = (" (tau=budget keeps the edges the data support, not a share of the genes)"
                       if tau_rule == "budget" else "")
        # The budget sized the graph by the data's evidence, and genes without an edge are still tokens of the model
        # (they only carry no causal position): a share below min_positioned is then information, not a fault.
        # A fixed tau that positions few genes is the user's choice to revisit: a warning.
        log = logger.info if tau_rule == "budget" else logger.warning
        if needed >= AUTO_TAU_FLOOR:
            log("%s: use tau=auto or tau≤%.2g to position %.0f%% of the genes, or more cells%s", reason,
                           needed, 100 * config.min_positioned, budget_note)
        else:  # no threshold would do it: advising tau=auto or a smaller tau would only fail or add noise
            log("%s: no threshold above the noise floor %g positions %.0f%% of the genes; more cells (%d "
                           "for %d genes) or fewer genes (preprocess n_top_genes) give Step I more to go on%s",
                           reason, AUTO_TAU_FLOOR, 100 * config.min_positioned, n_cells, n_genes, budget_note)
    return graph


def orient(config: CausalConfig, graph: Graph, X, intervened, genes: np.ndarray) -> dict | None:
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


def orient_without_labels(config: CausalConfig, graph: Graph, X) -> dict | None:
    """Turn ``graph``'s edges where the Gaussian likelihood says so (:func:`~cape.causal.orient_by_likelihood`); its
    record (``None`` with ``orient_by_likelihood`` off)."""
    if not config.orient_by_likelihood:
        return None
    graph.dag, turned = orient_by_likelihood(X, graph.dag, LIKELIHOOD_ORIENT_LEVEL)
    logger.info("orient_by_likelihood: %d of %d edge(s) turned (likelihood-ratio test at %g per turn)", turned,
                graph.n_edges, LIKELIHOOD_ORIENT_LEVEL)
    return {"level": LIKELIHOOD_ORIENT_LEVEL, "n_edges_turned": turned}


def shrunk_for(config: CausalConfig, budget: int | None, X, linalg_device=None) -> np.ndarray | None:
    """X's shrunk partial correlations (:func:`~cape.causal.shrunk_partial_correlations`) where Step I uses them: to
    rank the budget's pairs (``pair_ranking="shrunk_partial_correlation"``) and to order the edges with their
    confidence; ``None`` where neither applies or beyond :data:`BUDGET_MAX_GENES` genes (an M × M inverse)."""
    ranks = budget is not None and config.pair_ranking == "shrunk_partial_correlation"
    if not (ranks or config.edge_confidence) or X.shape[1] > BUDGET_MAX_GENES:
        return None
    return shrunk_partial_correlations(X, device=linalg_device)


def drop_guesses(graph: Graph, confidence: EdgeConfidence) -> None:
    """Remove ``graph``'s edges below :data:`~cape.causal.SOLID_CONFIDENCE` (in place; the confidence's record
    counts them). Removing edges keeps a DAG a DAG."""
    guesses = (graph.dag != 0) & (confidence.confidence < SOLID_CONFIDENCE)
    graph.dag = np.where(guesses, 0.0, graph.dag)
    confidence.confidence = np.where(guesses, 0.0, confidence.confidence)
    confidence.partial_correlation = np.where(guesses, 0.0, confidence.partial_correlation)
    if confidence.pair_partial_correlation is not None:
        confidence.pair_partial_correlation = np.where(guesses, 0.0, confidence.pair_partial_correlation)
    graph.n_positioned = int(((graph.dag != 0).any(axis=0) | (graph.dag != 0).any(axis=1)).sum())
    confidence.record["n_dropped_guesses"] = int(guesses.sum())
    logger.info("drop_guesses: %d edge(s) below confidence %g removed, %d kept", int(guesses.sum()),
                SOLID_CONFIDENCE, graph.n_edges)


def _record(config: CausalConfig, X, dropped: list[str], fit: CausalFit, graph: Graph, screened: bool) -> dict:
    """The parameters the fit used, its bookkeeping and the graph's figures (see :class:`CausalGraph`)."""
    n_genes = X.shape[1]
    rank_used = config.rank_for(n_genes, screened)
    record = {
        "rank_used": "dense" if rank_used is None else int(rank_used), "sparse_adjacency": bool(fit.sparse),
        "lambda_sparse_used": float(config.lambda_for(rank_used)), "device_used": fit.device,
        "n_cells": int(X.shape[0]), "n_genes": int(n_genes), "n_edges": graph.n_edges, "tau_used": graph.tau_used,
        "tau_rule": graph.tau_rule, "max_weight": graph.max_weight, "n_positioned": graph.n_positioned,
        "positioned_fraction": float(graph.n_positioned / n_genes), "threshold_scan": graph.scan,
        "removed_cycle_edges": graph.removed, "turned_cycle_edges": graph.turned, "dropped_constant_genes": dropped,
        "epochs_run": int(fit.epochs_run), "converged": bool(fit.converged), "collapsed": bool(fit.collapsed),
        "peak_weight": float(fit.peak_weight), "h_every": int(fit.h_every),
        "recon_fraction": float(fit.recon_fraction), "compiled_mlp": bool(fit.compiled_mlp),
        "cuda_graphs": bool(getattr(fit, "cuda_graphs", False)),
        "history": {k: np.asarray(v, dtype=np.float64) for k, v in fit.history.items()},
        "fit_seconds": float(fit.wall_time),
    }
    if fit.rho_max is not None:  # the variational model's augmented Lagrangian (parents_mlp has none)
        record["rho_max"] = float(fit.rho_max)
    return record


@dataclass
class CausalGraph:
    """Result of :func:`learn_causal_graph`.

    Attributes
    ----------
    dag
        The weighted DAG over ``genes`` (float, M×M; ``dag[i, j] ≠ 0`` means gene i → gene j).
    genes
        The genes of the graph, in its order (the input's, less the constant ones).
    fit
        The fit (:class:`~cape.causal.CausalFit`): the weights before thresholding, the model, its history.
    record
        What :func:`cape.tl.causal_graph` stores in ``uns["cape"]["causal_graph"]`` besides its ``params``: the fit's
        bookkeeping, the graph's figures, and ``edge_budget``, ``screening``, ``orientation``,
        ``likelihood_orientation`` and ``equations`` where they applied.
    candidates
        The screened candidate parents (boolean M×M) the fit was restricted to, or ``None``.
    confidence
        Each edge's confidence (M×M, 1 − q of its test given the child's other parents and the cells' state, 0 off
        the edges; :func:`cape.causal.edge_confidence`), or ``None`` with ``edge_confidence=False``.
    partial_correlation
        Each edge's partial correlation of cause and child given the child's other parents and the cells' state (M×M,
        0 off the edges; the size of the dependence the confidence tests), or ``None`` with ``edge_confidence=False``.
    pair_partial_correlation
        Each edge's partial correlation of its two genes given every other gene (M×M, shrunk; 0 off the edges), which
        orders the edges with the confidence (:func:`cape.causal.edge_order`); ``None`` without a confidence or beyond
        :data:`BUDGET_MAX_GENES` genes.
    pair_scores
        Under the budget's pair rankings other than the fit's (``pair_ranking="consensus"`` or
        ``"shrunk_partial_correlation"``), the symmetric M×M scores of :func:`cape.causal.ranked_pairs` by which the
        pairs were chosen, higher first (for ranking metrics such as a skeleton AUPRC); ``None`` where the fit's
        weights alone ranked them (``fit.adjacency``).
    """

    dag: np.ndarray
    genes: np.ndarray
    fit: CausalFit
    record: dict = field(default_factory=dict)
    candidates: np.ndarray | None = None
    confidence: np.ndarray | None = None
    pair_scores: np.ndarray | None = None
    partial_correlation: np.ndarray | None = None
    pair_partial_correlation: np.ndarray | None = None

    @property
    def n_edges(self) -> int:
        return int(np.count_nonzero(self.dag))


class _StageClock:
    """Wall seconds per stage of :func:`learn_causal_graph`, in the order the stages ran (the record's
    ``stage_seconds``): where a long run's time goes, without a profiler."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        """Charge the time since the last lap to ``stage``."""
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self._last
        self._last = now


def learn_causal_graph(X, genes, config: CausalConfig | None = None, *, intervened=None,
                       device: str | torch.device = "auto", seed: int = 0) -> CausalGraph:
    """Step I on a cells × genes matrix: checks, screen, fit, edge budget, threshold and cycle breaking, orientation.

    Parameters
    ----------
    X
        Cells × genes, log-normalised expression (NumPy array or SciPy sparse matrix), no NaN.
    genes
        The genes' names, one per column of X (they name the dropped genes and the equations' genes).
    config
        Step I's options (:class:`~cape.causal.CausalConfig`); default: its defaults.
    intervened
        Cells × genes boolean matrix (dense or sparse), True where the cell's label names that gene as intervened on
        (:func:`cape.tl.intervention_mask`), or ``None``: every cell observational. Its columns follow ``genes``
        (before constant genes are dropped).
    device
        ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``.
    seed
        Seeds initialisation, minibatch order and sampling.

    Returns
    -------
    The :class:`CausalGraph`.

    Raises
    ------
    CapeInputError
        NaN/inf values, fewer than :data:`~cape.causal.MIN_CELLS` cells, fewer than two usable genes, a diverging or
        collapsed fit (a collapse only warns with ``min_positioned=0``), or (``tau="auto"``) too few genes positioned
        above the noise floor.
    """
    clock = _StageClock()
    config = config or CausalConfig()
    genes_in = np.asarray(genes)
    X, genes, dropped = check_matrix(X, genes_in)
    if intervened is not None and dropped:
        intervened = sp.csr_matrix(intervened)[:, np.flatnonzero(np.isin(genes_in, genes))]
    check_size(config, X, genes)
    dev = resolve_device(device)
    linalg_device = dev if _fits_on_device(dev, linalg_bytes(*X.shape)) else None
    check_memory(config, X, linalg_device)
    clock.lap("checks")
    tests, candidates, screen_record = screen(config, X, linalg_device)
    clock.lap("screen")
    seed = seed_everything(seed)
    fitted = fit(config, X, dev, seed, intervened, candidates)
    clock.lap("fit")
    budget, budget_record, budget_tested = (edge_budget_for(X, tests, config, seed, linalg_device)
                                            if config.tau == "budget" else (None, None, None))
    clock.lap("edge_budget")
    config = replace(config, pair_ranking=pair_ranking_for(config.pair_ranking, intervened))
    shrunk = shrunk_for(config, budget, X, linalg_device)
    ranked = None
    if budget is not None and config.pair_ranking != "fit":
        if tests is None and X.shape[1] <= BUDGET_MAX_GENES:  # the screen was off: the same tests, on every cell
            tests = partial_correlation_tests(X, linalg_device)
        ranked = ranked_pairs(config.pair_ranking, fitted.adjacency, tests, X, linalg_device, shrunk)
    if budget is not None:
        budget_record["pair_ranking"] = config.pair_ranking if ranked is not None else "fit"
    clock.lap("pair_ranking")
    graph = threshold(fitted.adjacency, config, budget, X.shape[0], ranked,
                      None if budget_tested is None else np.isfinite(budget_tested[1]))
    clock.lap("threshold")
    orientation = orient(config, graph, X, intervened, genes)
    likelihood_orientation = orient_without_labels(config, graph, X) if intervened is None else None
    clock.lap("orientation")
    # Without the budget's tests of every pair, nothing else accounts for the graph's choice among every gene pair:
    # the edges' q-values count them all.
    every_pair = X.shape[1] * (X.shape[1] - 1) // 2 if budget_tested is None else None
    confidence = (edge_confidence(X, graph.dag, intervened=intervened, seed=seed, pair_partial_correlation=shrunk,
                                  n_hypotheses=every_pair) if config.edge_confidence else None)
    if confidence is not None and budget_tested is not None:  # budget None here: it tested and counted no pair
        confidence = cap_unsupported(confidence, graph.dag, budget_tested, budget or 0,
                                     BUDGET_TEST_NAMES[config.budget_test])
    if config.drop_guesses and confidence is not None:
        drop_guesses(graph, confidence)
    clock.lap("edge_confidence")
    record = _record(config, X, dropped, fitted, graph, screened=candidates is not None)
    extra = {"edge_budget": budget_record, "screening": screen_record, "orientation": orientation,
             "likelihood_orientation": likelihood_orientation,
             "edge_confidence": None if confidence is None else confidence.record,
             # a CausalFit built without its model (e.g. from a stored adjacency) has no equations
             "equations": None if fitted.model is None else equations_record(fitted, X, graph.dag, genes)}
    record.update({k: v for k, v in extra.items() if v is not None})
    clock.lap("equations")
    record["stage_seconds"] = clock.seconds
    logger.info("Step I's stages: %s", ", ".join(f"{k} {v:.1f} s" for k, v in clock.seconds.items()))
    return CausalGraph(graph.dag, genes, fitted, record, candidates,
                       None if confidence is None else confidence.confidence, graph.pair_scores,
                       None if confidence is None else confidence.partial_correlation,
                       None if confidence is None else confidence.pair_partial_correlation)
