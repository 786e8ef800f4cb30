"""``cape.tl.causal_graph``: Step I on an AnnData — the weighted causal gene DAG in ``varp["cape_dag"]``."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import anndata as ad
import numpy as np
import scipy.sparse as sp
import torch

from .. import __version__
from .._errors import CapeInputError
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
from ..causal.postprocess import (
    AUTO_TAU_FLOOR,
    AUTO_TAU_MAX,
    BUDGET_FDR,
    SCREEN_FDR,
    choose_tau,
    edge_budget,
    partial_correlation_tests,
    screen_candidates,
)
from ..causal.trainer import gene_moments
from ..tasks.perturbation import CONTROL, condition_genes

__all__ = ["AUTO_TAU_FLOOR", "AUTO_TAU_MAX", "DENSE_MAX_GENES", "MIN_CELLS", "MODELS", "SCAN_TAUS", "causal_graph"]

logger = logging.getLogger("cape")

#: Step I models: the paper's variational NOTEARS (low-rank, scales to whole transcriptomes) and the
#: nonlinear-parents SEM (:mod:`cape.causal.parents_mlp`; gene panels up to ``PARENTS_MLP_MAX_GENES``).
MODELS = ("variational", "parents_mlp", "paper")
#: ``rank="auto"``: a dense A up to this many genes, A = UVᵀ of rank :data:`LOW_RANK` above. One epoch of 2,000 cells on
#: one CPU thread took, dense vs rank 40: 0.6 vs 0.4 s at 200 genes, 1.0 vs 0.9 s at 500, 2.1 vs 1.5 s at 1,000 and
#: 8.3 vs 2.5 s at 2,000 (docs/benchmarks/step1_counts.md).
DENSE_MAX_GENES = 1000
LOW_RANK = 40
#: ``lambda_sparse=None``: λs for a dense A (measured on count data, see the docs page) and for A = UVᵀ (the paper's).
LAMBDA_DENSE = 0.3
LAMBDA_LOW_RANK = 1.0
#: Most genes the partial-correlation test of ``tau="budget"`` is run on (an M×M inverse); above, ``"auto"``'s rule.
BUDGET_MAX_GENES = 5000
#: ``screen`` values: candidate parents from partial correlations (dense A), or none.
SCREENS = ("partial_correlation", "none")
PARENTS_MLP_MAX_GENES = _parents_mlp.MAX_GENES
#: Thresholds at which ``uns["cape"]["causal_graph"]["threshold_scan"]`` counts surviving edges and genes.
SCAN_TAUS = (0.2, 0.1, 0.05, 0.02, 0.01)


def _select_genes(adata: ad.AnnData, use_genes) -> np.ndarray:
    """Boolean mask over ``adata.var_names`` of the genes to use."""
    if use_genes is None:
        return np.ones(adata.n_vars, dtype=bool)
    if isinstance(use_genes, str):
        if use_genes not in adata.var:
            if use_genes == "cape_used":
                logger.info("var['cape_used'] not found: using all %d genes", adata.n_vars)
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


def _check_tau(tau) -> float | str:
    """``"budget"``, ``"auto"`` or a float in [0, 1)."""
    if isinstance(tau, str) and tau.strip().lower() in ("auto", "budget"):
        return tau.strip().lower()
    if isinstance(tau, (int, float, np.integer, np.floating)) and not isinstance(tau, bool) \
            and np.isfinite(tau) and 0.0 <= tau < 1.0:
        return float(tau)
    raise CapeInputError(f"tau must be a number in [0, 1), 'budget' or 'auto', got {tau!r}")


def _check_parameters(rank, tau, lambda_sparse, epochs, batch_size, lr, h_every=None, min_positioned=0.5) -> None:
    _check_tau(tau)
    if isinstance(min_positioned, bool) or not (isinstance(min_positioned, (int, float, np.integer, np.floating))
                                                and 0.0 <= min_positioned <= 1.0):
        raise CapeInputError(f"min_positioned must be a fraction in [0, 1], got {min_positioned!r}")
    if rank is not None and rank != "auto" and (isinstance(rank, bool) or not isinstance(rank, (int, np.integer))
                                                or rank < 1):
        raise CapeInputError(f"rank must be a positive integer, None (dense) or 'auto', got {rank!r}")
    if lambda_sparse is not None and not (np.isfinite(lambda_sparse) and lambda_sparse >= 0):
        raise CapeInputError(f"lambda_sparse must be ≥ 0, got {lambda_sparse!r}")
    if not (isinstance(epochs, (int, np.integer)) and epochs >= 1):
        raise CapeInputError(f"epochs must be a positive integer, got {epochs!r}")
    if not (isinstance(batch_size, (int, np.integer)) and batch_size >= 1):
        raise CapeInputError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not (np.isfinite(lr) and lr > 0):
        raise CapeInputError(f"lr must be > 0, got {lr!r}")
    if h_every is not None and not (isinstance(h_every, (int, np.integer)) and h_every >= 1):
        raise CapeInputError(f"h_every must be a positive integer or None (automatic), got {h_every!r}")


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


def _intervention_mask(adata: ad.AnnData, key: str, genes: np.ndarray) -> tuple[sp.csr_matrix, dict]:
    """Cells × graph genes, True where the cell's label in ``obs[key]`` names that gene as intervened on.

    Labels are GEARS conditions (``"ctrl"``, ``"A+ctrl"``, ``"A+B"``). A target that is not a gene of ``adata``
    is an error; one that is a gene but not in the graph (not selected, or constant) is logged, and its cells
    keep every equation (nothing to leave out).
    """
    if key not in adata.obs:
        raise CapeInputError(f"interventions={key!r}: no such column in adata.obs (it should hold per-cell GEARS "
                             f"labels: '{CONTROL}', 'A+{CONTROL}', 'A+B')")
    labels = adata.obs[key]
    if labels.isna().any():
        raise CapeInputError(f"obs[{key!r}] has {int(labels.isna().sum())} missing label(s): label every cell "
                             f"('{CONTROL}' for controls)")
    labels = labels.astype(str).to_numpy()
    conditions = list(dict.fromkeys(labels))
    targets = {c: condition_genes(c) for c in conditions}
    all_targets = list(dict.fromkeys(g for t in targets.values() for g in t))
    unknown = [g for g in all_targets if g not in adata.var_names]
    if unknown:
        raise CapeInputError(f"obs[{key!r}] names {len(unknown)} intervened gene(s) not in var_names, e.g. "
                             f"{unknown[0]!r} (labels must be GEARS conditions: '{CONTROL}', 'A+{CONTROL}', 'A+B')")
    position = {str(g): i for i, g in enumerate(genes)}
    outside = [g for g in all_targets if g not in position]
    if outside:
        logger.warning("interventions: %d intervened gene(s) are not in the causal graph (not selected or "
                       "constant), e.g. %s; their cells keep every equation", len(outside), outside[0])
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


def causal_graph(
    adata: ad.AnnData,
    rank: int | str | None = "auto",
    tau: float | str = "budget",
    lambda_sparse: float | None = None,
    epochs: int = 100,
    batch_size: int = 128,
    lr: float = 3e-3,
    device: str = "auto",
    seed: int | None = 0,
    use_genes: str | Sequence[str] | np.ndarray | None = "cape_used",
    copy: bool = False,
    *,
    layer: str | None = None,
    key_added: str = "cape_dag",
    h_every: int | None = None,
    min_positioned: float = 0.5,
    model: str = "variational",
    interventions: str | None = None,
    screen: str = "partial_correlation",
) -> ad.AnnData | None:
    """Learn the causal gene graph (CAPE Step I: variational NOTEARS, paper Sec. 3.3).

    Parameters
    ----------
    adata
        Cells × genes; X (or ``layer``) preprocessed (e.g. log-normalised), dense or sparse, no NaN.
    rank
        Rank r of A = UVᵀ. ``"auto"`` (default): a dense A up to :data:`DENSE_MAX_GENES` genes (where it costs at
        most ~1.4 times the low-rank fit), rank :data:`LOW_RANK` above (the paper's; ``model="paper"``: always
        40). ``None``, or r ≥ the number of genes, uses a dense A (logged).
    tau
        Edge threshold τ ∈ [0, 1): ``|A_ij| ≤ τ`` is dropped (the paper uses 0.2), or a rule:
        ``"budget"`` (default): keep as many edges as the data support, the number K of gene pairs whose partial
        correlation given all other genes is significant (Fisher's z, Benjamini–Hochberg at 10 %,
        :func:`cape.causal.edge_budget`): τ is just below the K-th largest ``|A_ij|``, never at or below
        :data:`AUTO_TAU_FLOOR`. The test needs at least genes + 10 cells (and at most 5,000 genes); otherwise the
        ``"auto"`` rule is used, and so it is when no pair is significant (with a warning); the record says so.
        Under the budget the ``min_positioned`` check only warns: the edges kept are those the data support.
        ``"auto"``: the paper's 0.2 where it already gives an edge to at least ``min_positioned`` of the genes,
        else the largest τ that does, but not below :data:`AUTO_TAU_FLOOR` (weights at the optimiser's noise
        level).
    lambda_sparse
        λs of the L1 penalty (see :func:`cape.causal.fit_variational_notears` for its scaling). ``None`` (default):
        0.3 for a dense A (on count data λs = 1 starved the weak edges; docs/benchmarks/step1_counts.md), 1 (the
        paper's) for A = UVᵀ and as the multiplier of ``model="parents_mlp"``'s prices.
    epochs, batch_size, lr
        AdamW training (paper: 100, 128, 3e-3); training stops earlier once h has converged.
    device
        ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``.
    seed
        Seeds initialisation, minibatch order and sampling (same seed, same graph on CPU).
    use_genes
        Boolean ``var`` column (default ``"cape_used"``; all genes when it is absent), a boolean mask, a list
        of gene names, or ``None`` for all genes. Constant genes among them are dropped with a warning.
    copy
        Return a modified copy instead of writing into ``adata``.
    layer
        Use ``adata.layers[layer]`` instead of X.
    key_added
        ``varp`` key of the result.
    h_every
        Steps between exact evaluations of the acyclicity penalty; in between it uses its first-order
        model (see :func:`cape.causal.fit_variational_notears`). ``None``: exact every step while the
        exponential is small (min(genes, r(r+1)/2) ≤ 256), else every 10 steps; 1: always exact.
    model
        ``"variational"`` (default): the paper's variational NOTEARS, linear in a learnt per-gene feature
        space, low rank, for any number of genes. ``"parents_mlp"``: each gene an MLP of all its candidate
        parents, fitted in SDCD's two stages (:mod:`cape.causal.parents_mlp`): it can express parents acting
        together, which the paper's model cannot, and is for gene panels of at most
        ``PARENTS_MLP_MAX_GENES`` genes with at least 10·(genes − 1) cells (its cost grows with genes², not
        with cells; with fewer cells each gene's MLP fits noise). With it ``rank``,
        ``epochs``, ``batch_size``, ``lr`` and ``h_every`` do not apply, and ``lambda_sparse`` multiplies
        its L1 prices (:func:`cape.causal.fit_parents_mlp`). ``"paper"``: the paper's Step I exactly as published
        (variational NOTEARS with rank 40 and λs = 1 unless given; pass ``tau=0.2`` for its threshold), for
        reproducing the paper's figures.
    min_positioned
        Fraction of the used genes that must get at least one edge (be *positioned*). With ``tau="auto"``
        a graph below it raises :class:`~cape.CapeInputError` naming the cause and the remedy; with a fixed
        τ the same line is logged as a warning. 0 turns the check off (including the collapse check below).
    interventions
        ``obs`` column of per-cell intervention labels in GEARS format: ``"ctrl"`` for control cells,
        ``"A+ctrl"`` for cells where gene A was perturbed (knocked out, knocked down, inhibited), ``"A+B"`` for
        two genes (e.g. ``"condition"`` of :func:`cape.data.simulate_grn_cells` or of
        :func:`cape.data.sachs_interventions`; Perturb-seq labels need that form). For each perturbed cell the
        perturbed gene's own structural equation is left out of the likelihood (SDCD, DCD-FG), while its value
        still enters its children's equations: what orients the edges around it. Every named gene must be in
        ``var_names``; one outside the graph's genes is logged and its cells keep every equation. ``None``
        (default): every cell is treated as observational.
    screen
        ``"partial_correlation"`` (default): with a dense A (``model="variational"``), SDCD-style candidate parents:
        A may only use both directions of the gene pairs whose partial correlation is significant at 20 % FDR
        (:func:`cape.causal.screen_candidates`; skipped, and recorded, without enough cells for the test or
        without a significant pair). ``"none"``: every pair is a candidate.

    Reads
    -----
    ``X`` (or ``layers[layer]``) and the gene selection ``var["cape_used"]`` (``use_genes``).

    Writes
    ------
    - ``varp["cape_dag"]`` (``key_added``): CSR float32 n_vars × n_vars, ``A[i, j] ≠ 0`` means gene i → gene j,
      always a DAG, zero outside the genes used;
    - ``var["cape_used"]``: the genes that took part in the graph;
    - ``uns["cape"]["causal_graph"]``: parameters, seed, per-epoch loss/h/ρ/α, wall time, number of edges and of edges
      removed to break cycles, dropped constant genes, the cap on ρ (``rho_max``, variational model only);
      ``tau_used`` and ``tau_rule`` (``"fixed"``, ``"budget"``, ``"auto: paper"`` or ``"auto: positioning"``),
      ``edge_budget`` (``tau="budget"``: ``n_pairs`` = K, ``fdr``, or ``fallback``: why the ``"auto"`` rule was
      used), ``screening`` (dense A with ``screen="partial_correlation"``: ``fdr``, ``n_candidate_pairs``, or
      ``fallback``), ``lambda_sparse_used``, ``max_weight``,
      ``n_positioned`` and ``positioned_fraction``, ``collapsed`` and ``peak_weight`` (the collapse check: a fit
      whose weights once reached 0.1 but that ends with almost no weight above 0.01 raises, see Raises),
      ``interventions`` (with ``interventions=``: ``key``, ``n_intervened_cells``, ``n_control_cells``,
      ``n_conditions``, ``n_entries_left_out``, ``targets`` in the graph, ``targets_outside_graph``),
      and ``threshold_scan``: arrays ``tau`` (:data:`SCAN_TAUS` and
      ``tau_used``, descending), ``n_edges`` (edges of the DAG at that τ), ``n_positioned``, ``positioned_fraction``;
      ``equations``: the fitted structural equations that :func:`cape.tl.predict_intervention` evaluates (arrays and
      strings only): ``genes`` (the genes used, in model order), ``layer``, ``kind`` = ``"learned"``, the DAG's edges
      ``source``/``target``/``weight`` (indices into ``genes``, feature-space weights), ``order`` (a topological
      order), the standardisation ``mean``/``std``, the encoder and decoder MLPs ``enc_*``/``dec_*``, the feature
      normalisation ``feat_mean``/``feat_scale`` (with ``model="parents_mlp"``: ``kind`` = ``"parents_mlp"`` and each
      edge's first-layer weights ``edge_w1`` and each gene's ``b1``/``w2``/``b2`` instead of the MLPs and
      normalisation, see :class:`cape.causal.StructuralEquations`), and each gene's observed
      ``obs_min``/``obs_max``/``obs_mean`` (for the range check and the ``"2x"`` convenience).

    Returns
    -------
    ``None``, or the copy when ``copy=True``.

    Raises
    ------
    CapeInputError
        τ neither in [0, 1) nor ``"auto"``, NaN/inf values, fewer than :data:`MIN_CELLS` cells, fewer than two
        usable genes, invalid parameters, or (``tau="auto"``) fewer than ``min_positioned`` of the genes
        positioned by weights above :data:`AUTO_TAU_FLOOR`; a collapsed fit (A driven to almost nothing after
        it had found weights, unless ``min_positioned=0``, then it warns); a missing ``interventions`` column,
        a missing label or one naming a gene not in ``var_names``. Fewer cells than genes only warns.
    """

    start = time.perf_counter()
    if isinstance(rank, str) and rank != "auto":
        raise CapeInputError(f"rank must be a positive integer, None (dense) or 'auto', got {rank!r}")
    _check_parameters(rank, tau, lambda_sparse, epochs, batch_size, lr, h_every, min_positioned)
    if model not in MODELS:
        raise CapeInputError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    tau = _check_tau(tau)
    if layer is not None and layer not in adata.layers:
        raise CapeInputError(f"layer {layer!r} not found in adata.layers")
    if copy:
        adata = adata.copy()
    mask = _select_genes(adata, use_genes)
    X = adata.layers[layer] if layer is not None else adata.X
    if X is None:
        raise CapeInputError("adata.X is empty")
    X = X[:, np.flatnonzero(mask)]
    X = sp.csr_matrix(X, dtype=np.float32) if sp.issparse(X) else np.asarray(X, dtype=np.float32)
    values = X.data if sp.issparse(X) else X
    if not np.all(np.isfinite(values)):
        if sp.issparse(X):
            bad_col = int(X.indices[~np.isfinite(X.data)][0])
        else:
            bad_col = int(np.flatnonzero((~np.isfinite(X)).any(axis=0))[0])
        gene = adata.var_names[np.flatnonzero(mask)][bad_col]
        raise CapeInputError(f"X has NaN or infinite values (e.g. gene {gene!r}): impute or filter them first")
    n_cells = X.shape[0]
    if n_cells < MIN_CELLS:
        raise CapeInputError(f"causal_graph needs at least {MIN_CELLS} cells, got {n_cells}")

    genes = np.asarray(adata.var_names[mask])
    _, std = gene_moments(X)
    constant = std <= 1e-12
    if constant.any():
        names = genes[constant]
        shown = ", ".join(map(str, names[:10])) + (f" … ({len(names)} in all)" if len(names) > 10 else "")
        logger.warning("dropping %d constant gene(s) from the causal graph: %s", len(names), shown)
        keep = ~constant
        X = X[:, np.flatnonzero(keep)]
        genes = genes[keep]
    n_genes = genes.size
    intervened, intervention_record = (None, None) if interventions is None else \
        _intervention_mask(adata, interventions, genes)
    if n_genes < 2:
        raise CapeInputError(f"a causal graph needs at least 2 non-constant genes, got {n_genes}"
                             + (f" ({genes[0]})" if n_genes == 1 else ""))
    if n_cells < n_genes:
        logger.warning("fewer cells (%d) than genes (%d): the graph will be poorly determined", n_cells, n_genes)
    if model == "parents_mlp" and n_genes > PARENTS_MLP_MAX_GENES:
        raise CapeInputError(f"model='parents_mlp' fits at most {PARENTS_MLP_MAX_GENES} genes, got {n_genes}: select "
                             "fewer (preprocess n_top_genes, use_genes) or use model='variational'")
    if model == "parents_mlp" and n_cells < _parents_mlp.min_cells(n_genes):
        most = n_cells // _parents_mlp.min_cells(2) + 1
        raise CapeInputError(f"model='parents_mlp' needs at least {_parents_mlp.min_cells(n_genes)} cells for "
                             f"{n_genes} genes (one per weight of a gene's MLP), got {n_cells}: use at most {most} "
                             "genes (preprocess n_top_genes, use_genes) or model='variational'")
    rank_used = rank
    if model == "parents_mlp":
        rank_used = None
    elif rank == "auto":
        rank_used = LOW_RANK if model == "paper" or n_genes > DENSE_MAX_GENES else None
        if rank_used is not None and rank_used >= n_genes:
            rank_used = None
    elif rank is not None and rank >= n_genes:
        logger.warning("rank %d ≥ number of genes %d: using a dense adjacency instead", rank, n_genes)
        rank_used = None
    if lambda_sparse is not None:
        lambda_used = float(lambda_sparse)
    else:
        lambda_used = LAMBDA_DENSE if rank_used is None and model == "variational" else LAMBDA_LOW_RANK

    if screen not in SCREENS:
        raise CapeInputError(f"screen must be one of {', '.join(SCREENS)}, got {screen!r}")
    tests = None
    wants_screen = screen == "partial_correlation" and model == "variational" and rank_used is None
    if (tau == "budget" or wants_screen) and n_genes <= BUDGET_MAX_GENES:
        tests = partial_correlation_tests(X)
    candidates, screen_record = None, None
    if wants_screen:
        candidates = screen_candidates(X, SCREEN_FDR, tests) if tests is not None else None
        screen_record = ({"fdr": SCREEN_FDR, "n_candidate_pairs": int(candidates.sum() // 2)}
                         if candidates is not None else
                         {"fallback": "no partial-correlation test (fewer than genes + 10 cells, or more than "
                                      f"{BUDGET_MAX_GENES} genes) or no significant pair: every pair is a candidate"})

    seed = seed_everything(resolve_seed(seed))
    dev = resolve_device(device)
    try:
        if model == "parents_mlp":
            fit = fit_parents_mlp(X, lambda_screen=lambda_used * _parents_mlp.LAMBDA_SCREEN,
                                  lambda_sparse=lambda_used * _parents_mlp.LAMBDA_SPARSE, device=dev, seed=seed,
                                  intervened=intervened)
        else:
            fit = fit_variational_notears(X, rank=rank_used, lambda_sparse=lambda_used, epochs=epochs,
                                          batch_size=batch_size, lr=lr, device=dev, seed=seed, h_every=h_every,
                                          intervened=intervened, candidates=candidates)
    except FloatingPointError as err:
        raise CapeInputError(f"{err}; try a smaller lr (got {lr}) or check X for extreme values") from err
    if fit.collapsed:
        if min_positioned > 0:
            raise CapeInputError(fit.collapse_message)
        logger.warning("%s (min_positioned=0: keeping the graph)", fit.collapse_message)
    budget_record: dict | None = None
    budget = None
    if tau == "budget":
        if n_genes > BUDGET_MAX_GENES:
            budget_record = {"fallback": f"more than {BUDGET_MAX_GENES} genes: tau='auto' rule"}
        else:
            budget = edge_budget(X, BUDGET_FDR, tests)
            if budget is None:
                budget_record = {"fallback": f"fewer than genes + 10 cells ({n_cells} for {n_genes} genes) for the "
                                             "partial-correlation test: tau='auto' rule"}
            elif budget == 0:
                budget_record = {"n_pairs": 0, "fdr": BUDGET_FDR,
                                 "fallback": f"no gene pair has a significant partial correlation (FDR {BUDGET_FDR:g}, "
                                             f"{n_cells} cells, {n_genes} genes): tau='auto' rule, on weak evidence"}
                budget = None
            else:
                budget_record = {"n_pairs": int(budget), "fdr": BUDGET_FDR}
        if budget is None:
            (logger.warning if budget_record.get("n_pairs") == 0 else logger.info)(
                "tau='budget': %s", budget_record["fallback"])
    tau_used, tau_rule = choose_tau(fit.adjacency, tau, min_positioned, budget)
    dag, removed = make_dag(fit.adjacency, tau_used)
    if removed:
        logger.info("removed %d edge(s) to break cycles left after thresholding", removed)
    rows, cols = np.nonzero(dag)
    n_positioned = int(((dag != 0).any(axis=0) | (dag != 0).any(axis=1)).sum())
    max_weight = float(np.abs(fit.adjacency).max()) if fit.adjacency.size else 0.0
    scan = _threshold_scan(fit.adjacency, (*SCAN_TAUS, tau_used))
    logger.info("Step I: %d edges, %d of %d genes positioned at tau=%.3g (%s); largest weight %.3g; "
                "edges (positioned genes) by tau: %s", rows.size, n_positioned, n_genes, tau_used, tau_rule,
                max_weight, _format_scan(scan))
    if tau_rule == "budget":
        logger.info("tau='budget': %d gene pairs have a significant partial correlation (BH %g): kept the %d "
                    "heaviest edges of the DAG (tau=%.3g)", budget, BUDGET_FDR, rows.size, tau_used)
    if n_positioned < min_positioned * n_genes:

        needed = tau_positioning(fit.adjacency, min_positioned)
        reason = (f"Step I kept {rows.size} edges ({n_positioned / n_genes:.0%} of {n_genes} genes positioned) at "
                  f"tau={tau_used:.3g}; the largest weight is {max_weight:.2g}")
        if tau_rule.startswith("auto"):
            raise CapeInputError(
                f"{reason}, and positioning {min_positioned:.0%} of the genes would need tau≤{needed:.2g}, "
                f"below the noise floor {AUTO_TAU_FLOOR}: use more cells ({n_cells} for {n_genes} genes), fewer "
                f"genes (preprocess n_top_genes), or a fixed tau to accept such weak edges")
        logger.warning("%s: use tau=auto or tau≤%.2g to position %.0f%% of the genes, or more cells"
                       + (" (tau=budget keeps the edges the data support, not a share of the genes)"
                          if tau_rule == "budget" else ""), reason, needed, 100 * min_positioned)

    index = adata.var_names.get_indexer(genes)
    full = sp.csr_matrix((dag[rows, cols].astype(np.float32), (index[rows], index[cols])),
                         shape=(adata.n_vars, adata.n_vars))
    adata.varp[key_added] = full
    adata.var["cape_used"] = adata.var_names.isin(genes)

    record = {
        "params": {"rank": "dense" if rank is None else rank if rank == "auto" else int(rank), "tau": tau,
                   "lambda_sparse": "auto" if lambda_sparse is None else float(lambda_sparse),
                   "epochs": int(epochs), "batch_size": int(batch_size),
                   "lr": float(lr), "device": str(device), "seed": int(seed),
                   "use_genes": use_genes if isinstance(use_genes, str) else "custom",
                   "layer": layer or "X", "key_added": key_added,
                   "h_every": "auto" if h_every is None else int(h_every),
                   "min_positioned": float(min_positioned), "model": model,
                   "interventions": interventions or "none", "screen": screen},
        "rank_used": "dense" if rank_used is None else int(rank_used),
        "lambda_sparse_used": float(lambda_used),
        "device_used": fit.device,
        "n_cells": int(n_cells),
        "n_genes": int(n_genes),
        "n_edges": int(rows.size),
        "tau_used": float(tau_used),
        "tau_rule": tau_rule,
        "max_weight": max_weight,
        "n_positioned": n_positioned,
        "positioned_fraction": float(n_positioned / n_genes),
        "threshold_scan": scan,
        "removed_cycle_edges": int(removed),
        "dropped_constant_genes": [str(g) for g in np.asarray(adata.var_names[mask])[constant]],
        "epochs_run": int(fit.epochs_run),
        "converged": bool(fit.converged),
        "collapsed": bool(fit.collapsed),
        "peak_weight": float(fit.peak_weight),
        "h_every": int(fit.h_every),
        "recon_fraction": float(fit.recon_fraction),
        "compiled_mlp": bool(fit.compiled_mlp),
        "history": {k: np.asarray(v, dtype=np.float64) for k, v in fit.history.items()},
        "fit_seconds": float(fit.wall_time),
        "wall_time": float(time.perf_counter() - start),
        "versions": {"cape": str(__version__), "torch": str(torch.__version__)},
    }
    if intervention_record is not None:
        record["interventions"] = intervention_record
    if budget_record is not None:
        record["edge_budget"] = budget_record
    if screen_record is not None:
        record["screening"] = screen_record
    if fit.rho_max is not None:  # the variational model's augmented Lagrangian (parents_mlp has none)
        record["rho_max"] = float(fit.rho_max)
    if fit.model is not None:  # a CausalFit built without its model (e.g. from a stored adjacency) has none
        record["equations"] = _equations_record(fit, X, dag, genes, layer)
    adata.uns.setdefault("cape", {})["causal_graph"] = record
    logger.info("causal graph: %d genes, %d edges (%d removed to break cycles), %.1f s",
                n_genes, rows.size, removed, record["wall_time"])
    return adata if copy else None
