"""Does Step II's embedding keep the DAG's hierarchy? Spearman correlation of generality π with −‖e‖.

The paper's premise (Sec. 3.4, Eq. 17) is that causally general genes sit near the origin of the ball. Whether an
embedding delivers it is measured over the genes *with an edge*: genes without one all share the smallest π (a
tie block that carries no ranking), and on graphs where most genes have no edge they would dominate a correlation
over all genes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import spearmanr

__all__ = ["MIN_HIERARCHY_SPEARMAN", "Hierarchy", "hierarchy_spearman"]

#: Rule of thumb, not a measured threshold: below this Spearman(π, −‖e‖) over the genes with an edge, the norms do
#: not order the genes by generality (the fidelity tests on trees and scale-free DAGs sit well above it).
MIN_HIERARCHY_SPEARMAN = 0.5


@dataclass(frozen=True)
class Hierarchy:
    """Spearman(π, −‖e‖) over ``n_genes`` genes; ``spearman`` is NaN when it is undefined (< 3 genes, or π or the
    norms constant)."""

    spearman: float
    n_genes: int

    @property
    def missing(self) -> bool:
        """The norms do not order the genes by generality: ρ below :data:`MIN_HIERARCHY_SPEARMAN`, or undefined."""
        return not (np.isfinite(self.spearman) and self.spearman >= MIN_HIERARCHY_SPEARMAN)


def hierarchy_spearman(generality: np.ndarray, poincare: np.ndarray, among: np.ndarray | None = None) -> Hierarchy:
    """Spearman correlation of generality π with −‖e‖ over the genes of ``among``.

    Parameters
    ----------
    generality
        (M,) PageRank generality π.
    poincare
        (M, d) Poincaré-ball positions e.
    among
        (M,) bool mask of the genes to correlate over (e.g. those with an edge); default all.

    Returns
    -------
    Hierarchy
        ρ (positive: general genes nearer the origin) and the number of genes it was computed on.
    """
    pi = np.asarray(generality, dtype=np.float64).ravel()
    norms = np.linalg.norm(np.asarray(poincare, dtype=np.float64), axis=1)
    if among is not None:
        mask = np.asarray(among, dtype=bool).ravel()
        pi, norms = pi[mask], norms[mask]
    n = int(pi.size)
    if n < 3 or np.ptp(pi) == 0 or np.ptp(norms) == 0:
        return Hierarchy(float("nan"), n)
    return Hierarchy(float(spearmanr(pi, -norms).statistic), n)
