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
from .._settings import resolve_seed
from ..causal.causal_config import (
    DENSE_MAX_GENES,
    LAMBDA_DENSE,
    LAMBDA_LOW_RANK,
    LOW_RANK,
    MODELS,
    SCREENS,
    CausalConfig,
)
from ..causal.pipeline import BUDGET_MAX_GENES, PARENTS_MLP_MAX_GENES, SCAN_TAUS, check_matrix, learn_causal_graph
from ..causal.postprocess import AUTO_TAU_FLOOR, AUTO_TAU_MAX
from ..causal.trainer import MIN_CELLS
from ..data.user_files import detect_scale
from ..tasks.perturbation import CONTROL, intervention_labels
from ._uns import DAG_KEY, step_key

__all__ = ["AUTO_TAU_FLOOR", "AUTO_TAU_MAX", "BUDGET_MAX_GENES", "DATA_KEYS", "DENSE_MAX_GENES", "LAMBDA_DENSE",
           "LAMBDA_LOW_RANK", "LOW_RANK", "MIN_CELLS", "MODELS", "PARENTS_MLP_MAX_GENES", "SCAN_TAUS", "SCREENS",
           "CausalConfig", "causal_graph", "intervention_mask"]

logger = logging.getLogger("cape")

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


@dataclass
class _Selection:
    """The matrix Step I learns from: the selected, non-constant genes of X (or a layer), float32."""

    X: np.ndarray | sp.csr_matrix
    genes: np.ndarray
    dropped: list[str]


def _select(adata: ad.AnnData, use_genes, layer: str | None) -> _Selection:
    """The genes of ``use_genes`` in X (or ``layer``), finite, with constant genes dropped (a warning)."""
    if layer is not None and layer not in adata.layers:
        raise CapeInputError(f"layer {layer!r} not found in adata.layers")
    mask = _select_genes(adata, use_genes, layer)
    X = adata.layers[layer] if layer is not None else adata.X
    if X is None:
        raise CapeInputError("adata.X is empty")
    return _Selection(*check_matrix(X[:, np.flatnonzero(mask)], np.asarray(adata.var_names[mask])))


def _max_steps_record(max_steps: int | str | None) -> int | str:
    return "none" if max_steps is None else max_steps if isinstance(max_steps, str) else int(max_steps)


def _params_record(config: CausalConfig, *, device, seed: int, use_genes, layer, key_added, interventions) -> dict:
    """``params`` of the record: the options as given (``"auto"``/``"dense"``/``"none"`` for None)."""
    rank = config.rank
    return {"rank": "dense" if rank is None else rank if rank == "auto" else int(rank), "tau": config.tau,
            "budget_fdr": float(config.budget_fdr),
            "budget_fill_fdr": "none" if config.budget_fill_fdr is None else float(config.budget_fill_fdr),
            "budget_test": config.budget_test,
            "pair_ranking": config.pair_ranking,
            "budget_cells": "all" if config.budget_cells is None else int(config.budget_cells),
            "lambda_sparse": "auto" if config.lambda_sparse is None else float(config.lambda_sparse),
            "epochs": int(config.epochs), "max_steps": _max_steps_record(config.max_steps),
            "batch_size": int(config.batch_size), "lr": float(config.lr),
            "device": str(device), "seed": int(seed),
            "use_genes": use_genes if isinstance(use_genes, str) else "custom", "layer": layer or "X",
            "key_added": key_added, "h_every": "auto" if config.h_every is None else int(config.h_every),
            "min_positioned": float(config.min_positioned), "model": config.model,
            "interventions": interventions or "none", "screen": config.screen,
            "leave_out_targets": bool(config.leave_out_targets), "orient_by_shifts": bool(config.orient_by_shifts),
            "orient_by_likelihood": bool(config.orient_by_likelihood),
            "edge_confidence": bool(config.edge_confidence), "drop_guesses": bool(config.drop_guesses)}


def _write_graph(adata: ad.AnnData, result, key_added: str) -> None:
    """``varp[key_added]`` and, with a confidence, ``varp[key_added + "_confidence"]``,
    ``varp[key_added + "_partial_correlation"]`` and (where computed) ``varp[key_added + "_pair_partial_correlation"]``
    at the same entries (an edge at 0 stays an entry); without them, those left from an earlier run, which would
    describe another graph, are removed."""
    rows, cols = np.nonzero(result.dag)
    index = adata.var_names.get_indexer(result.genes)
    shape = (adata.n_vars, adata.n_vars)
    adata.varp[key_added] = sp.csr_matrix((result.dag[rows, cols].astype(np.float32), (index[rows], index[cols])),
                                          shape=shape)
    for suffix, values in (("_confidence", result.confidence), ("_partial_correlation", result.partial_correlation),
                           ("_pair_partial_correlation", result.pair_partial_correlation)):
        if values is not None:
            adata.varp[key_added + suffix] = sp.csr_matrix(
                (values[rows, cols].astype(np.float32), (index[rows], index[cols])), shape=shape)
        else:
            adata.varp.pop(key_added + suffix, None)


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
        ``lambda_sparse``, ``epochs``, ``max_steps``, ``batch_size``, ``lr``, ``h_every``, ``screen``; see it for the
        τ rules ``"budget"`` and ``"auto"``); default: the workflow's defaults.
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
    - ``varp["cape_dag_confidence"]`` (``key_added + "_confidence"``; with ``edge_confidence``, the default): each
      edge's confidence in [0, 1], 1 − the q-value of its test given the child's other parents and the cells' state
      (:func:`cape.causal.edge_confidence`), at the graph's entries; ≥ :data:`~cape.causal.SOLID_CONFIDENCE`: solid;
    - ``varp["cape_dag_partial_correlation"]`` (with the confidence): each edge's partial correlation of cause and
      child given the child's other parents and the cells' state, in [−1, 1], the size of what the confidence tests;
    - ``varp["cape_dag_pair_partial_correlation"]`` (with the confidence, ≤ :data:`BUDGET_MAX_GENES` genes): each
      edge's shrunk partial correlation given every other gene, in [−1, 1]; :func:`~cape.causal.edge_order` uses it;
    - ``var["cape_used"]``: the genes that took part in the graph;
    - ``uns["cape"]["causal_graph"]`` (see ``key_added``): ``params``; the fit (``history`` per epoch, ``epochs_run``,
      ``converged``, ``collapsed``, ``peak_weight``, ``rank_used``, ``sparse_adjacency``, ``lambda_sparse_used``,
      ``rho_max``, ``fit_seconds``, ``stage_seconds``, ``wall_time``); the graph (``n_edges``, ``tau_used``,
      ``tau_rule``, ``max_weight``, ``n_positioned``, ``positioned_fraction``, ``removed_cycle_edges``,
      ``turned_cycle_edges``, ``dropped_constant_genes``, ``threshold_scan`` at :data:`SCAN_TAUS`); ``edge_budget``
      (``n_pairs``: ``n_pairs_significant`` less ``n_pairs_permuted``, filled from the ``fill_fdr`` counts; ``fdr``,
      the test, ``pair_ranking``), ``screening``, ``interventions`` and ``orientation`` (tests, shifted pairs, supported
      and turned edges) where applied; ``edge_confidence`` (cell states, solid edges); and ``equations``, the structural
      equations :func:`cape.tl.predict_intervention` evaluates (:class:`cape.causal.StructuralEquations`).

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
    seed = resolve_seed(seed)
    result = learn_causal_graph(data.X, data.genes, config, intervened=intervened, device=device, seed=seed)
    _write_graph(adata, result, key_added)
    adata.var["cape_used"] = adata.var_names.isin(result.genes)
    record = {"params": _params_record(config, device=device, seed=seed, use_genes=use_genes, layer=layer,
                                       key_added=key_added, interventions=interventions), **result.record}
    record["dropped_constant_genes"] = data.dropped
    if intervention_record is not None:
        record["interventions"] = intervention_record
    if "equations" in record:
        record["equations"]["layer"] = layer or "X"
    record["wall_time"] = float(time.perf_counter() - start)
    record["versions"] = {"cape": str(__version__), "torch": str(torch.__version__)}
    adata.uns.setdefault("cape", {})[step_key("causal_graph", key_added, DAG_KEY)] = record
    logger.info("causal graph: %d genes, %d edges (%d removed to break cycles), %.1f s",
                result.genes.size, result.n_edges, record["removed_cycle_edges"], record["wall_time"])
    return adata if copy else None
