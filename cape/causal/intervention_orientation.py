"""Orienting a graph's kept edges by what the labelled interventions moved.

Under a DAG, an intervention on gene i can only change the distribution of i's descendants. So if gene j's level
differs between the cells intervened on i alone and the control cells, j descends from i and an edge j → i would close a
cycle: a kept edge between them must point i → j. :func:`shift_tests` tests every (intervened gene, other gene)
pair with a two-sample t-test, :func:`descendant_evidence` keeps the pairs that pass Benjamini–Hochberg, and
:func:`orient_by_shifts` turns each kept edge that contradicts the evidence (and is not contradicted the other way)
around, then breaks any cycle the turns close with :func:`~cape.causal.make_dag`. The skeleton is unchanged
except for edges dropped to break such cycles.

The argument needs no model of how strongly i acts on j, only that i's intervention reaches j. With few cells per
intervention (tens) most weak effects go undetected and their edges keep the fit's direction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy import stats

from .postprocess import make_dag

__all__ = ["MIN_DETECTING_CELLS", "MIN_SHIFT_CELLS", "ORIENT_FDR", "Orientation", "descendant_evidence",
           "orient_by_shifts", "shift_tests"]

#: Benjamini–Hochberg rate over all (intervened gene, other gene) tests.
ORIENT_FDR = 0.05
#: Fewest intervened (or control) cells a test needs: a variance needs two; three keep one odd cell out.
MIN_SHIFT_CELLS = 3
#: A gene is tested only where the intervened cells would hold at least this many cells that detect it (its share
#: of nonzero control cells × their number): the t distribution of a mean of mostly zeros is far off in the tail.
MIN_DETECTING_CELLS = 5


def _column_moments(X, rows: np.ndarray, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-column mean, unbiased variance and share of nonzero entries of ``X[rows]``, two passes over chunks of rows
    (a sparse X is densified a chunk at a time)."""

    def blocks():
        for start in range(0, rows.size, chunk):
            block = X[rows[start:start + chunk]]
            yield (block.toarray() if sp.issparse(block) else np.asarray(block)).astype(np.float64, copy=False)

    mean = sum(block.sum(0) for block in blocks()) / rows.size
    var = sum(((block - mean) ** 2).sum(0) for block in blocks()) / (rows.size - 1)
    detected = sum((block != 0).sum(0) for block in blocks()) / rows.size
    return mean, var, detected


def shift_tests(X, intervened) -> np.ndarray:
    """Every (intervened gene g, gene j) pair's two-sided p-value for j's mean differing between the cells intervened
    on g alone and the control cells (cells with no intervention): Student's two-sample t with the pooled variance.

    The null hypothesis is that g's intervention leaves j's distribution as it is in the control cells, and under it
    the two groups share one variance, which the many control cells estimate well. Welch's test would take the
    variance of the few intervened cells at its word: in sparse counts, tens of cells that happen to be all zero
    for a gene have variance 0 and would make any control mean look shifted. A gene is tested for g only where g's
    cells would hold at least :data:`MIN_DETECTING_CELLS` cells that detect it at its control rate, since the t
    distribution of a mean of mostly zeros is far off in the tail that a false discovery rate reads. Cells
    intervened on g and another gene are left out of g's tests: the other target's effects would pass for g's.

    Parameters
    ----------
    X
        Cells × genes (dense or sparse), the matrix the graph was learnt from.
    intervened
        Cells × genes boolean (dense or sparse): True where the cell was intervened on that gene.

    Returns
    -------
    P, genes × genes: ``P[g, j]`` the p-value; NaN on the diagonal, for genes with fewer than :data:`MIN_SHIFT_CELLS`
    cells intervened on them alone, for all genes when there are fewer control cells than that, for genes detected
    too rarely (above), and where both sides are constant.
    """
    mask = intervened.toarray() if sp.issparse(intervened) else np.asarray(intervened)
    mask = mask.astype(bool, copy=False)
    if mask.shape != X.shape:
        raise ValueError(f"intervened has shape {mask.shape}, X has {X.shape}")
    m = X.shape[1]
    P = np.full((m, m), np.nan)
    n_targets = mask.sum(axis=1)
    control = np.flatnonzero(n_targets == 0)
    single = mask & (n_targets == 1)[:, None]
    if control.size < MIN_SHIFT_CELLS:
        return P
    n0 = float(control.size)
    mean0, var0, detected0 = _column_moments(X, control)
    for g in np.flatnonzero(single.sum(axis=0) >= MIN_SHIFT_CELLS):
        cells = np.flatnonzero(single[:, g])
        n1 = float(cells.size)
        mean1, var1, _ = _column_moments(X, cells)
        dof = n0 + n1 - 2.0
        pooled = ((n0 - 1.0) * var0 + (n1 - 1.0) * var1) / dof
        se2 = pooled * (1.0 / n0 + 1.0 / n1)
        with np.errstate(divide="ignore", invalid="ignore"):
            p = 2.0 * stats.t.sf(np.abs(mean1 - mean0) / np.sqrt(se2), dof)
        p[~(se2 > 0) | ~np.isfinite(p) | (n1 * detected0 < MIN_DETECTING_CELLS)] = np.nan
        p[g] = np.nan
        P[g] = p
    return P


def descendant_evidence(P: np.ndarray, fdr: float = ORIENT_FDR) -> np.ndarray:
    """Boolean genes × genes: ``[g, j]`` where j shifted under g's intervention, Benjamini–Hochberg at ``fdr`` over
    every tested pair (the finite entries of ``P``)."""
    if not 0 < fdr < 1:
        raise ValueError(f"fdr must be in (0, 1), got {fdr}")
    tested = np.isfinite(P)
    out = np.zeros(P.shape, dtype=bool)
    p = P[tested]
    if p.size == 0:
        return out
    ranked = np.sort(p)
    passed = np.flatnonzero(ranked <= fdr * np.arange(1, p.size + 1) / p.size)
    if passed.size:
        out[tested] = p <= ranked[passed[-1]]
    return out


@dataclass
class Orientation:
    """What :func:`orient_by_shifts` did to a graph: the result, its figures, the kept edges the evidence supports
    and the turned edges still in ``dag`` (index pairs into the graph's genes, as the edges point in ``dag``)."""

    dag: np.ndarray
    n_tested_pairs: int
    n_shifted_pairs: int
    supported: tuple[np.ndarray, np.ndarray]
    turned: tuple[np.ndarray, np.ndarray]
    n_turned: int
    n_removed: int

    @property
    def n_supported(self) -> int:
        return int(self.supported[0].size)

    def record(self, fdr: float, genes: np.ndarray | None = None) -> dict:
        """The figures for ``uns`` (h5ad-serialisable); with ``genes``, the supported and turned edges by name
        (``supported_source``/``supported_target``, ``turned_source``/``turned_target``)."""
        out = {"fdr": float(fdr), "n_tested_pairs": self.n_tested_pairs, "n_shifted_pairs": self.n_shifted_pairs,
               "n_edges_supported": self.n_supported, "n_edges_turned": self.n_turned,
               "n_removed_cycle_edges": self.n_removed}
        if genes is not None:
            names = np.asarray([str(g) for g in genes], dtype=object)
            for key, (source, target) in (("supported", self.supported), ("turned", self.turned)):
                out[f"{key}_source"], out[f"{key}_target"] = names[source], names[target]
        return out


def orient_by_shifts(dag: np.ndarray, evidence: np.ndarray, n_tested: int = 0) -> Orientation:
    """Turn each kept edge i → j for which i shifted under j's intervention but j did not shift under i's.

    ``evidence`` is :func:`descendant_evidence`'s matrix; ``n_tested`` (the number of tests) is only recorded. A
    turned edge keeps its weight (on z-scored genes a pair's regression slope is the same both ways). Where turns
    close a cycle, :func:`~cape.causal.make_dag` drops the lightest edge on it. ``supported`` lists the kept edges
    whose final direction the evidence supports, ``turned`` the turned edges that were kept (``n_turned`` counts them
all).
    """
    dag = np.asarray(dag)
    if evidence.shape != dag.shape:
        raise ValueError(f"evidence has shape {evidence.shape}, the graph {dag.shape}")
    rows, cols = np.nonzero(dag)
    turn = evidence[cols, rows] & ~evidence[rows, cols]
    out = dag.copy()
    out[rows[turn], cols[turn]] = 0
    out[cols[turn], rows[turn]] = dag[rows[turn], cols[turn]]
    out, removed = make_dag(out, 0.0)
    kept_rows, kept_cols = np.nonzero(out)
    supported = evidence[kept_rows, kept_cols]
    turned_kept = out[cols[turn], rows[turn]] != 0
    return Orientation(out, int(n_tested), int(evidence.sum()), (kept_rows[supported], kept_cols[supported]),
                       (cols[turn][turned_kept], rows[turn][turned_kept]), int(turn.sum()), int(removed))
