"""``cape.tl.predict_intervention``: knock-outs and over-expression in Step I's structural equations, on an AnnData."""

from __future__ import annotations

import difflib
import logging
import re
import warnings
from collections.abc import Mapping

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

from .._errors import CapeInputError
from ..causal.confidence import SOLID_CONFIDENCE
from ..causal.equivalence import MAX_PARENT_SETS, TooManyParentSets, intervene_equivalence_class
from ..causal.structural_equations import MODES, StructuralEquations, intervene, linear_equations
from ._uns import DAG_KEY, h5ad_safe, step_record

__all__ = ["EQUATIONS", "intervention_values", "load_equations", "predict_intervention"]

logger = logging.getLogger("cape")

#: ``equations=``: Step I's fitted encoder/SEM/decoder; each gene refit on its parents by least squares; or
#: least-squares effects averaged over the parent sets the graph's Markov equivalence class allows (IDA).
EQUATIONS = ("learned", "linear", "equivalence_class")
_MULTIPLE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*x\s*$")
_KNOCK_OUT = {"ko", "knockout", "knock-out", "0"}

_NO_MODEL = ("AnnData has no Step I model (uns['cape']['causal_graph']['equations']): run cape.tl.causal_graph "
             "(`cape causal`) first")


def load_equations(adata: ad.AnnData, graph: str | None = None) -> dict:
    """Step I's stored equations record (see :func:`cape.tl.causal_graph`), or a one-line error naming the step.

    ``graph``: the ``varp`` key Step I wrote (``key_added``); its own record when it has one, else the default
    graph's (``uns["cape"]["causal_graph"]``), e.g. for a graph that did not come from Step I.
    """
    record = step_record(adata, "causal_graph", graph or DAG_KEY, DAG_KEY)
    if not isinstance(record, Mapping):
        record = step_record(adata, "causal_graph", DAG_KEY, DAG_KEY)
    if not isinstance(record, Mapping) or not isinstance(record.get("equations"), Mapping):
        if isinstance(record, Mapping):
            raise CapeInputError(_NO_MODEL.replace("first", "again (this graph was learnt by a cape without "
                                                            "stored equations)"))
        raise CapeInputError(_NO_MODEL)
    return record["equations"]


def _closest(name: str, genes) -> str:
    close = difflib.get_close_matches(name, list(genes), n=5, cutoff=0.5)
    if close:
        return f"closest: {', '.join(close)}"
    return f"{len(genes)} genes in the graph, e.g. {', '.join(list(genes)[:5])}"


def intervention_values(intervention: Mapping[str, float | str], genes, obs_mean: np.ndarray,
                        obs_min: np.ndarray | None = None, obs_max: np.ndarray | None = None) -> dict[int, float]:
    """Resolve ``{gene: value}`` to ``{index in genes: float}``.

    A value is a number (in the units of the matrix Step I was fitted on), ``"ko"``/``0`` (knock-out: 0) or
    ``"<k>x"`` (over- or under-expression: k times the gene's observed mean). Genes not in ``genes`` raise a
    one-line error listing the closest names; values outside the observed range warn (the equations
    extrapolate there).
    """
    genes = [str(g) for g in genes]
    index = {g: i for i, g in enumerate(genes)}
    if not intervention:
        raise CapeInputError("no intervention given: pass e.g. {'GENE': 0} (knock-out) or {'GENE': '2x'}")
    out: dict[int, float] = {}
    for gene, value in intervention.items():
        gene = str(gene)
        if gene not in index:
            raise CapeInputError(f"gene {gene!r} is not in the causal graph ({_closest(gene, genes)})")
        i = index[gene]
        if isinstance(value, str):
            text = value.strip().lower()
            match = _MULTIPLE.match(text)
            if text in _KNOCK_OUT:
                v = 0.0
            elif match:
                v = float(match.group(1)) * float(obs_mean[i])
            else:
                try:
                    v = float(text)
                except ValueError:
                    raise CapeInputError(f"value {value!r} for {gene}: expected a number, 'ko' or a multiple of the "
                                         "observed mean such as '2x'") from None
        elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            v = float(value)
        else:
            raise CapeInputError(f"value {value!r} for {gene}: expected a number, 'ko' or e.g. '2x'")
        if not np.isfinite(v):
            raise CapeInputError(f"value {value!r} for {gene} is not finite")
        if obs_min is not None and obs_max is not None and not obs_min[i] <= v <= obs_max[i]:
            message = (f"do({gene} = {v:.4g}) lies outside the observed range [{obs_min[i]:.4g}, {obs_max[i]:.4g}]: "
                       "the structural equations extrapolate there")
            warnings.warn(message, UserWarning, stacklevel=3)
        out[i] = v
    return out


def _graph_dag(adata: ad.AnnData, cols: np.ndarray, graph: str | None) -> tuple[str, np.ndarray]:
    """``varp[graph]`` (default Step I's ``cape_dag``) over the graph's genes, dense."""
    key = graph or "cape_dag"
    if key not in adata.varp:
        raise CapeInputError(f"varp[{key!r}] not found: run cape.tl.causal_graph (`cape causal`) first, or pass "
                             "graph= naming a varp key")
    A = adata.varp[key]
    A = A.tocsr() if sp.issparse(A) else sp.csr_matrix(np.asarray(A))
    return key, A[cols][:, cols].toarray()


def _guess_edges(adata: ad.AnnData, cols: np.ndarray, graph: str | None, intervened: list[int],
                 reached: np.ndarray) -> tuple[int, int]:
    """(guesses, edges) among the graph's edges from an intervened or reached gene into a reached one, by the
    confidence stored beside the graph; (0, 0) without a stored confidence."""
    key = graph or "cape_dag"
    if f"{key}_confidence" not in adata.varp or key not in adata.varp:
        return 0, 0
    dag = _graph_dag(adata, cols, key)[1] != 0
    confidence = sp.csr_matrix(adata.varp[f"{key}_confidence"])[cols][:, cols].toarray()
    sources = np.asarray(reached, dtype=bool).copy()
    sources[intervened] = True
    travelled = dag & sources[:, None] & np.asarray(reached, dtype=bool)[None, :]
    return int(np.count_nonzero(travelled & (confidence < SOLID_CONFIDENCE))), int(np.count_nonzero(travelled))


def _linear(adata: ad.AnnData, X: np.ndarray, cols: np.ndarray, graph: str | None) -> StructuralEquations:
    key, dag = _graph_dag(adata, cols, graph)
    try:
        return linear_equations(X, dag)
    except ValueError as err:
        raise CapeInputError(f"varp[{key!r}]: {err}") from None


def _equivalence_class(adata, X, genes, cols, do, graph, mode, n_cells, seed):
    """IDA over ``varp[graph]``'s equivalence class: (predicted, reference, reached genes, uns extras)."""
    if len(do) != 1:
        raise CapeInputError("equations='equivalence_class' predicts one intervened gene at a time (a joint "
                             f"intervention on {len(do)} genes needs the class's member DAGs): use equations="
                             "'learned' or 'linear'")
    key, dag = _graph_dag(adata, cols, graph)
    (g, v), = do.items()
    try:
        predicted, reference, effects, sets = intervene_equivalence_class(X, dag, g, v, mode=mode, n_cells=n_cells,
                                                                         seed=seed, max_sets=MAX_PARENT_SETS)
    except TooManyParentSets:
        raise CapeInputError(f"{genes[g]} has more than {MAX_PARENT_SETS} possible parent sets in the equivalence "
                             f"class of varp[{key!r}] (many undirected neighbours that are adjacent to one another): "
                             "use equations='learned' or 'linear'") from None
    except ValueError as err:
        raise CapeInputError(f"varp[{key!r}]: {err}") from None
    reached = (effects != 0).any(0)
    reached[g] = False
    per_set = np.zeros((len(sets), adata.n_vars))
    per_set[:, cols] = effects * (v - reference[:, g].mean())  # the cells the shift is measured on
    per_set[:, cols[g]] = 0.0
    return predicted, reference, reached, {"parent_sets": ["+".join(genes[i] for i in s) for s in sets],
                                           "shift_per_parent_set": per_set}


def predict_intervention(
    adata: ad.AnnData,
    intervention: Mapping[str, float | str],
    n_cells: int | None = None,
    mode: str = "counterfactual",
    equations: str = "learned",
    seed: int = 0,
    key_added: str = "cape_intervention",
    copy: bool = False,
    *,
    graph: str | None = None,
) -> ad.AnnData | None:
    """Predict the expression after do(x_g = v): fix the intervened genes, propagate through the structural equations.

    Parameters
    ----------
    adata
        AnnData on which :func:`cape.tl.causal_graph` ran. Reads ``uns["cape"]["causal_graph"]["equations"]``
        (the fitted model), the matrix Step I was fitted on (X or the layer it names) for abduction, and, with
        ``equations="linear"``, ``varp[graph]``.
    intervention
        ``{gene: value}``. Values are in the units of that matrix: a number, ``"ko"`` or ``0`` (knock-out), or
        ``"<k>x"`` (k times the gene's observed mean, e.g. ``"2x"`` for over-expression).
    n_cells
        Counterfactual: predict for this many of the observed cells (drawn at random; default all).
        Interventional: generate this many cells (default: as many as observed).
    mode
        ``"counterfactual"``: each observed cell keeps its abducted noise, so genes the intervention does not
        reach keep their observed values exactly. ``"interventional"``: new cells from noise drawn per gene
        from the abducted noise; the shift is measured against cells generated from the same draws without
        the intervention.
    equations
        ``"learned"``: Step I's encoder, feature-space SEM and decoder. ``"linear"``: each gene refit by least
        squares on its parents in ``varp[graph]`` (any DAG: Step I's, a consensus graph, a peer's).
        ``"equivalence_class"``: observational cells cannot tell the DAGs of ``varp[graph]``'s Markov
        equivalence class apart, and they may disagree on which way the edges at the intervened gene point;
        this averages the least-squares total effects over every parent set of the gene that the class allows
        (IDA, :mod:`cape.causal.equivalence`) instead of betting on one orientation. One intervened gene;
        interventional mode draws observed cells with replacement (their linear counterfactuals).
    seed
        Seeds the cell draws.
    key_added
        Where results go (below).
    copy
        Leave ``adata`` untouched and return a copy holding the results (counterfactual over all cells).
    graph
        ``varp`` key of the graph for ``equations="linear"`` (default: Step I's, ``varp["cape_dag"]``).

    Reads
    -----
    ``uns["cape"]["causal_graph"]["equations"]`` (Step I's fitted model), ``X`` or the layer Step I was fitted on,
    and ``varp["cape_dag"]`` (``graph``) with ``equations="linear"`` or ``"equivalence_class"``.

    Writes
    ------
    ``layers["cape_intervention"]`` (``key_added``; counterfactual over all cells), ``var["cape_intervention_shift"]``
    (``f"{key_added}_shift"``) and ``uns["cape_intervention"]`` (``key_added``), in ``adata`` unless ``copy``;
    otherwise a new AnnData of predicted cells (see below).

    Returns
    -------
    Counterfactual over all observed cells: ``None`` (or the copy), with ``layers[key_added]`` the predicted
    expression (genes outside the graph keep their values). Otherwise (interventional, or a subset of cells):
    a new AnnData of the predicted cells over the graph's genes (``X``; ``layers["reference"]`` the same cells
    without intervention). Either way ``var[f"{key_added}_shift"]`` holds the predicted mean shift per gene
    (0 outside the graph) and ``uns[key_added]`` the intervention (resolved values), ``mode``, ``equations``,
    ``n_cells``, ``seed``, ``shift`` (array over ``var_names``), ``descendants`` (names) and ``no_effect``
    (intervened genes without descendants); with ``equations="equivalence_class"`` also ``parent_sets`` (the
    intervened gene's parent sets the class allows, names joined by ``+``, ``""`` for none) and
    ``shift_per_parent_set`` (parent sets × ``var_names``); in ``adata`` too unless ``copy``.

    Raises
    ------
    CapeInputError
        No Step I model, a gene not in the graph (closest names listed), an unreadable value, bad options.
        Values outside the observed range and interventions on genes without descendants (prediction equal to
        the no-change baseline) only warn.
    """
    _check_options(mode, equations, n_cells)
    record = load_equations(adata, graph)
    genes, cols, matrix, X = _fitted_matrix(adata, record)
    obs_mean, obs_min, obs_max = (np.asarray(record[k], dtype=np.float64) for k in ("obs_mean", "obs_min", "obs_max"))
    # called here, not in a helper, so that its out-of-range warning points at the caller (stacklevel=3)
    do = intervention_values(intervention, genes, obs_mean, obs_min, obs_max)
    predicted, reference, reached, no_effect, extra = _predict(adata, record, X, genes, cols, do, equations=equations,
                                                               graph=graph, mode=mode, n_cells=n_cells, seed=seed)
    shift, summary = _summarise(adata, genes, cols, do, predicted, reference, reached, no_effect, extra, mode=mode,
                                equations=equations, graph=graph, seed=seed)
    return _write_results(adata, matrix, genes, cols, predicted, reference, shift, summary, mode=mode,
                          key_added=key_added, copy=copy)


def _check_options(mode: str, equations: str, n_cells: int | None) -> None:
    """One-line errors for :func:`predict_intervention`'s options."""
    if mode not in MODES:
        raise CapeInputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if equations not in EQUATIONS:
        raise CapeInputError(f"equations must be one of {', '.join(EQUATIONS)}, got {equations!r}")
    if n_cells is not None and (isinstance(n_cells, bool) or not isinstance(n_cells, (int, np.integer))
                                or n_cells < 1):
        raise CapeInputError(f"n_cells must be a positive integer or None, got {n_cells!r}")


def _fitted_matrix(adata: ad.AnnData, record: Mapping) -> tuple[list[str], np.ndarray, object, np.ndarray]:
    """The graph's genes, their columns in ``adata``, the matrix Step I was fitted on (X or its layer) and its
    graph columns as dense float64 (for abduction)."""
    genes = [str(g) for g in np.asarray(record["genes"])]
    missing = [g for g in genes if g not in adata.var_names]
    if missing:
        raise CapeInputError(f"{len(missing)} gene(s) of Step I's graph are not in the AnnData (e.g. {missing[0]!r}): "
                             "predict on the AnnData Step I ran on")
    layer = str(record.get("layer", "X"))
    if layer != "X" and layer not in adata.layers:
        raise CapeInputError(f"Step I was fitted on layers[{layer!r}], which this AnnData lacks")
    cols = adata.var_names.get_indexer(genes)
    matrix = adata.X if layer == "X" else adata.layers[layer]
    X = matrix[:, cols]
    X = np.asarray(X.toarray() if sp.issparse(X) else X, dtype=np.float64)
    return genes, cols, matrix, X


def _predict(adata: ad.AnnData, record: Mapping, X: np.ndarray, genes: list[str], cols: np.ndarray,
             do: dict[int, float], *, equations: str, graph: str | None, mode: str, n_cells: int | None,
             seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], dict]:
    """(predicted, reference, reached genes, intervened genes without descendants, uns extras); warns when an
    intervened gene reaches nothing."""
    extra: dict = {}
    if equations == "equivalence_class":
        predicted, reference, reached, extra = _equivalence_class(adata, X, genes, cols, do, graph, mode, n_cells,
                                                                  seed)
        no_effect = [] if reached.any() else [genes[i] for i in do]
    else:
        eq = StructuralEquations.from_dict(record) if equations == "learned" else _linear(adata, X, cols, graph)
        reached = eq.descendants(list(do))
        no_effect = [genes[i] for i in do if not eq.descendants([i]).any()]
    if no_effect:
        message = (f"{', '.join(no_effect)} ha{'s' if len(no_effect) == 1 else 've'} no descendants in the graph: "
                   "the prediction for every other gene is the no-change baseline")
        warnings.warn(message, UserWarning, stacklevel=3)  # at predict_intervention's caller
    guesses, travelled = _guess_edges(adata, cols, graph, list(do), reached)
    extra |= {"n_edges_travelled": travelled, "n_guess_edges_travelled": guesses}
    if guesses:
        message = (f"{guesses} of the {travelled} edges the effect of {', '.join(genes[i] for i in do)} travels are "
                   f"guesses (confidence < {SOLID_CONFIDENCE:g} in varp[{(graph or 'cape_dag') + '_confidence'!r}]: "
                   "the child's other parents and the cells' state explain them, or Step I's edge budget did not count "
                   "their gene pairs); the shifts through them lack support")
        warnings.warn(message, UserWarning, stacklevel=3)
    if equations != "equivalence_class":
        predicted, reference = intervene(eq, X, do, mode=mode, n_cells=n_cells, seed=seed)
    return predicted, reference, reached, no_effect, extra


def _summarise(adata: ad.AnnData, genes: list[str], cols: np.ndarray, do: dict[int, float], predicted: np.ndarray,
               reference: np.ndarray, reached: np.ndarray, no_effect: list[str], extra: dict, *, mode: str,
               equations: str, graph: str | None, seed: int) -> tuple[np.ndarray, dict]:
    """The mean shift per gene (over ``var_names``, 0 outside the graph) and the ``uns`` record; logs the largest."""
    names = [genes[i] for i in do]
    shift = np.zeros(adata.n_vars)
    shift[cols] = predicted.mean(0) - reference.mean(0)
    summary = h5ad_safe({
        "intervention": {genes[i]: float(v) for i, v in do.items()},
        "mode": mode, "equations": equations, "graph": graph or ("learned" if equations == "learned" else "cape_dag"),
        "n_cells": int(predicted.shape[0]), "seed": int(seed), "shift": shift,
        "descendants": [genes[i] for i in np.flatnonzero(reached)], "no_effect": no_effect, **extra,
    })
    logger.info("do(%s): %d %sdescendant gene(s); largest predicted shifts: %s",
                ", ".join(f"{genes[i]}={v:.3g}" for i, v in do.items()), int(reached.sum()),
                "possible " if equations == "equivalence_class" else "",
                ", ".join(f"{adata.var_names[i]} {shift[i]:+.3g}" for i in np.argsort(-np.abs(shift))[:5]
                          if adata.var_names[i] not in names and shift[i] != 0) or "none")
    return shift, summary


def _write_results(adata: ad.AnnData, matrix, genes: list[str], cols: np.ndarray, predicted: np.ndarray,
                   reference: np.ndarray, shift: np.ndarray, summary: dict, *, mode: str, key_added: str,
                   copy: bool) -> ad.AnnData | None:
    """Counterfactual over all cells: into ``adata`` (or its copy, returned). Otherwise a new AnnData of the
    predicted cells; the shift and the record go to ``adata`` (unless ``copy``) and to it."""
    target = adata.copy() if copy else adata
    new_cells = mode == "interventional" or predicted.shape[0] != adata.n_obs
    if not new_cells:
        full = matrix.toarray() if sp.issparse(matrix) else np.array(matrix, dtype=np.float64)
        full = np.asarray(full, dtype=np.float32)
        full[:, cols] = predicted
        target.layers[key_added] = full
    target.var[f"{key_added}_shift"] = shift
    target.uns[key_added] = summary
    if not new_cells:
        return target if copy else None
    cells = ad.AnnData(X=predicted.astype(np.float32), var=pd.DataFrame(index=pd.Index(genes)),
                       obs=pd.DataFrame(index=[f"predicted{i}" for i in range(predicted.shape[0])]))
    cells.layers["reference"] = reference.astype(np.float32)
    cells.var = adata.var.iloc[cols].copy()
    cells.var[f"{key_added}_shift"] = shift[cols]
    cells.uns[key_added] = summary
    return cells
