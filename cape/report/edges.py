"""The report's table of Step I's strongest edges, each with its confidence: which edges are solid, which guesses."""

from __future__ import annotations

import anndata as ad
import numpy as np
import scipy.sparse as sp

from .._tables import markdown_table
from ..causal import MIN_DETECTED_CELLS, SOLID_CONFIDENCE, edge_order

__all__ = ["N_EDGES_SHOWN", "edge_table", "solid_sentence"]

#: Edges listed: the most trusted first (the heaviest without a confidence).
N_EDGES_SHOWN = 15


def solid_sentence(record: dict, n_edges: int) -> str | None:
    """``"N of M edges solid (...)"`` from Step I's ``edge_confidence`` record; ``None`` without one."""
    if not record or not n_edges:
        return None
    if record.get("n_pairs_supported") == 0:
        return (f"0 of {n_edges} edges solid: the edge budget counted no gene pair given every other gene, so every "
                "edge is a guess")
    budget = (f", and the pair is among the {int(record['n_pairs_supported'])} the edge budget counted given every "
              "other gene" if "n_pairs_supported" in record else
              "; Step I's edge budget did not run, so no test of each pair given every other gene backs it"
              + (f", and the q-values count all {int(record['n_hypotheses']):,} gene pairs the graph was chosen from"
                 if record.get("n_hypotheses", 0) > n_edges else ""))
    untested = int(record.get("n_untested", 0))
    untested = (f"; {untested} not tested, guesses (a gene varying in fewer than "
                f"{int(record.get('min_detected_cells', MIN_DETECTED_CELLS))} cells, or no degrees of freedom left)"
                if untested else "")
    return (f"{int(record['n_solid'])} of {n_edges} edges solid (confidence ≥ {float(record['solid_confidence']):g}: "
            f"the dependence holds given the child's other parents and {int(record['n_states'])} cell state(s)"
            f"{budget}){untested}")


def edge_table(adata: ad.AnnData, key: str = "cape_dag", n: int = N_EDGES_SHOWN) -> str | None:
    """Markdown: ``n`` edges of ``varp[key]`` with weight and, where stored, partial correlation and confidence;
    ``None`` when the graph is absent or empty.

    With a confidence the most trusted edges are listed (:func:`cape.causal.edge_order`: by confidence, ties by
    |partial correlation|, and, where stored, no higher than the pair's partial correlation given every other gene
    ranks), else the heaviest. Where Step I oriented edges by perturbations (its ``orientation``
    record), a column says whose each direction is; where it recorded none, a sentence says every direction is the
    fit's."""
    if key not in adata.varp:
        return None
    A = sp.coo_matrix(adata.varp[key])
    keep = A.data != 0
    rows, cols, weights = A.row[keep], A.col[keep], A.data[keep]
    if not weights.size:
        return None
    confidence = _stored(adata, f"{key}_confidence", rows, cols)
    partial = _stored(adata, f"{key}_partial_correlation", rows, cols)
    pair = _stored(adata, f"{key}_pair_partial_correlation", rows, cols)
    if confidence is not None:
        rank = edge_order(confidence, np.zeros_like(confidence) if partial is None else partial, pair)
        order = np.lexsort((-np.abs(weights), -rank))[:n]
    else:
        order = np.argsort(-np.abs(weights), kind="stable")[:n]
    genes = np.asarray(adata.var_names)
    record = adata.uns.get("cape", {}).get("causal_graph", {})
    backed = _perturbation_backed(record.get("orientation"))
    header = (["cause", "effect", "weight"] + (["partial r"] if partial is not None else [])
              + (["r, all genes"] if pair is not None else [])
              + (["confidence", ""] if confidence is not None else []) + (["direction"] if backed is not None else []))
    table = []
    for e in order:
        row = [genes[rows[e]], genes[cols[e]], f"{weights[e]:+.3g}"]
        row += [f"{partial[e]:+.2f}"] if partial is not None else []
        row += [f"{pair[e]:+.2f}"] if pair is not None else []
        if confidence is not None:
            row += [f"{confidence[e]:.3f}", "solid" if confidence[e] >= SOLID_CONFIDENCE else "guess"]
        if backed is not None:
            row += ["perturbations" if (str(genes[rows[e]]), str(genes[cols[e]])) in backed else "fit"]
        table.append(row)
    directions = _direction_note(record, backed)
    if confidence is None:
        return (f"## Strongest edges\n\nThe {len(order)} heaviest of {weights.size} edges (no confidence stored)."
                f"{directions}\n\n" + markdown_table(header, table))
    then = ("the size of the partial correlation (*partial r*: cause and effect given the effect's other parents and "
            "the cells' state)" if partial is not None else "weight")
    ranked = f": by confidence, then by {then}."
    if pair is not None:  # two rankings: an edge stands at the lower of its two ranks
        ranked = (f". Each edge is ranked twice, (1) by confidence, then by {then}, and (2) by the size of its genes' "
                  "partial correlation given every other gene (*r, all genes*); it stands at the lower of the two.")
    note = (f"The {len(order)} most trusted of {weights.size} edges{ranked} A *guess* "
            f"(confidence below {SOLID_CONFIDENCE:g}) is an edge whose dependence the child's other parents and the "
            "cells' state (Leiden clusters) explain, whose gene pair Step I's edge budget did not count given every "
            f"other gene, or that joins a gene varying in fewer than {MIN_DETECTED_CELLS} cells (not tested); a "
            "*solid* edge can still be indirect, through a gene the graph missed." + directions)
    return "## Strongest edges\n\n" + note + "\n\n" + markdown_table(header, table)


def _perturbation_backed(orientation: dict | None) -> set[tuple[str, str]] | None:
    """The (cause, effect) names whose direction the perturbations' shifts support or turned, from Step I's
    ``orientation`` record; ``None`` without the record."""
    if not orientation:
        return None
    backed = set()
    for key in ("supported", "turned"):
        sources, targets = orientation.get(f"{key}_source", ()), orientation.get(f"{key}_target", ())
        backed |= {(str(a), str(b)) for a, b in zip(sources, targets, strict=False)}
    return backed


def _direction_note(record: dict, backed: set[tuple[str, str]] | None) -> str:
    """A sentence on whose the directions are: the fit's alone (no orientation record), or partly the
    perturbations'; empty where no Step I record is stored (nothing to say either way)."""
    if not record:
        return ""
    if backed is None:
        return (" No edge was oriented by perturbed cells, so every direction is the fit's alone: read cause → "
                "effect as a hypothesis (the confidence is about the pair, not its direction).")
    return (" *direction*: *perturbations* where the shifts that a perturbed gene caused support or set the edge's "
            "direction, *fit* where they say nothing and the direction is the fit's alone.")


def _stored(adata: ad.AnnData, name: str, rows: np.ndarray, cols: np.ndarray) -> np.ndarray | None:
    """``varp[name]`` at the edges (``rows``, ``cols``), or ``None`` when not stored."""
    if name not in adata.varp:
        return None
    return np.asarray(sp.csr_matrix(adata.varp[name])[rows, cols]).ravel()
