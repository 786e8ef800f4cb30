"""The report's table of Step I's strongest edges, each with its confidence: which edges are solid, which guesses."""

from __future__ import annotations

import anndata as ad
import numpy as np
import scipy.sparse as sp

from .._tables import markdown_table
from ..causal import SOLID_CONFIDENCE

__all__ = ["N_EDGES_SHOWN", "edge_table", "solid_sentence"]

#: Edges listed, heaviest first.
N_EDGES_SHOWN = 15


def solid_sentence(record: dict, n_edges: int) -> str | None:
    """``"N of M edges solid (...)"`` from Step I's ``edge_confidence`` record; ``None`` without one."""
    if not record or not n_edges:
        return None
    return (f"{int(record['n_solid'])} of {n_edges} edges solid (confidence ≥ {float(record['solid_confidence']):g}: "
            f"the dependence holds given the child's other parents and {int(record['n_states'])} cell state(s))")


def edge_table(adata: ad.AnnData, key: str = "cape_dag", n: int = N_EDGES_SHOWN) -> str | None:
    """Markdown: the ``n`` heaviest edges of ``varp[key]`` with weight and, where stored, confidence; ``None``
    when the graph is absent or empty."""
    if key not in adata.varp:
        return None
    A = sp.coo_matrix(adata.varp[key])
    keep = A.data != 0
    rows, cols, weights = A.row[keep], A.col[keep], A.data[keep]
    if not weights.size:
        return None
    order = np.argsort(-np.abs(weights), kind="stable")[:n]
    confidence = None
    if f"{key}_confidence" in adata.varp:
        stored = sp.csr_matrix(adata.varp[f"{key}_confidence"])
        confidence = np.asarray(stored[rows[order], cols[order]]).ravel()
    genes = np.asarray(adata.var_names)
    header = ["cause", "effect", "weight"] + (["confidence", ""] if confidence is not None else [])
    table = []
    for k, e in enumerate(order):
        row = [genes[rows[e]], genes[cols[e]], f"{weights[e]:+.3g}"]
        if confidence is not None:
            row += [f"{confidence[k]:.3f}", "solid" if confidence[k] >= SOLID_CONFIDENCE else "guess"]
        table.append(row)
    note = (f"The {len(order)} heaviest of {weights.size} edges. A *guess* (confidence below {SOLID_CONFIDENCE:g}) is "
            "an edge whose dependence the child's other parents and the cells' state (Leiden clusters) explain; a "
            "*solid* edge can still be indirect, through a gene the graph missed."
            if confidence is not None else f"The {len(order)} heaviest of {weights.size} edges (no confidence stored).")
    return "## Strongest edges\n\n" + note + "\n\n" + markdown_table(header, table)
