"""k-hop positive pairs of a weighted DAG and their weights (the positives N⁺ₖ of Eq. 16).

The paper weights a positive pair (m, n) by ``|A_mn|``, which only exists for direct edges; it leaves the
weight of a multi-hop pair open. cape uses the **strongest path product**:

    w_mn = max over directed paths P from m to n, or from n to m, with 1 ≤ |P| ≤ k, of Π_{e ∈ P} |A_e| / max|A|

- Strengths are first divided by the largest ``|A|`` so every weight lies in (0, 1]: a path is never stronger
  than its weakest edge, and longer paths are weaker unless their edges are much stronger than a weak direct
  edge (then the strong 2-hop route wins, which is what "strongest path" means).
- Direction is ignored for membership (ancestors and descendants within k hops are both positives: distance
  is symmetric), but paths must be directed: siblings (a common parent) and co-parents are *not* positives.
- In a DAG at most one direction has a path, so the weight is well defined and symmetric.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .._errors import CapeInputError


@dataclass(frozen=True)
class PositivePairs:
    """Symmetric positive pairs as COO arrays (each unordered pair appears twice, once per anchor).

    Attributes
    ----------
    rows, cols
        Anchor m and positive n (int64), sorted by (row, col).
    weights
        Strongest-path-product weight in (0, 1] (float64).
    n_nodes
        M, the number of nodes.
    """

    rows: np.ndarray
    cols: np.ndarray
    weights: np.ndarray
    n_nodes: int

    def __len__(self) -> int:
        return int(self.rows.size)

    def to_sparse(self) -> sp.csr_matrix:
        """The weights as a symmetric M×M CSR matrix (0 = not a positive)."""
        return sp.csr_matrix((self.weights, (self.rows, self.cols)), shape=(self.n_nodes, self.n_nodes))

    def counts(self) -> np.ndarray:
        """Number of positives of each node, shape (M,)."""
        return np.bincount(self.rows, minlength=self.n_nodes)

    def per_anchor(self) -> PositivePairs:
        """The same pairs with each anchor's weights divided by their sum (each anchor's weights sum to 1; the
        matrix is no longer symmetric)."""
        total = np.bincount(self.rows, weights=self.weights, minlength=self.n_nodes)
        return PositivePairs(rows=self.rows, cols=self.cols, weights=self.weights / total[self.rows],
                             n_nodes=self.n_nodes)


def strongest_path_products(adjacency: sp.spmatrix, k: int) -> sp.csr_matrix:
    """Directed max-product path strengths up to ``k`` hops.

    Parameters
    ----------
    adjacency
        M×M weighted adjacency (i → j when ``A[i, j] != 0``), assumed acyclic.
    k
        Maximum number of hops (≥ 1).

    Returns
    -------
    scipy.sparse.csr_matrix
        ``S[m, n]`` = max over directed paths m ⇝ n with at most k edges of the product of ``|A_e| / max|A|``.
    """
    if int(k) != k or k < 1:
        raise CapeInputError(f"k_hop must be a positive integer, got {k!r}")
    step = sp.csr_matrix(abs(adjacency), dtype=np.float64)
    step.eliminate_zeros()
    n = step.shape[0]
    if step.nnz == 0:
        return sp.csr_matrix((n, n))
    step = step / step.data.max()
    step = sp.csr_matrix(step)
    best = step.tocoo()
    frontier = best  # strongest products of paths with exactly `hop` edges
    for _hop in range(1, int(k)):
        # Extend every frontier path (m ⇝ l) by every edge (l → n): max-times product, done on COO arrays.
        counts = np.diff(step.indptr)[frontier.col]
        if counts.sum() == 0:
            break
        starts = step.indptr[frontier.col]
        edge_index = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        rows = np.repeat(frontier.row, counts)
        cols = step.indices[edge_index]
        vals = np.repeat(frontier.data, counts) * step.data[edge_index]
        frontier = _max_coo(rows, cols, vals, n)
        best = _max_coo(np.concatenate([best.row, frontier.row]), np.concatenate([best.col, frontier.col]),
                        np.concatenate([best.data, frontier.data]), n)
    return best.tocsr()


def khop_positives(adjacency: sp.spmatrix, k: int = 2) -> PositivePairs:
    """Positive pairs of Eq. 16: nodes joined by a directed path of at most ``k`` edges, either direction.

    Weights are strongest path products (see the module docstring).
    """
    paths = strongest_path_products(adjacency, k).tocoo()
    n = adjacency.shape[0]
    sym = _max_coo(np.concatenate([paths.row, paths.col]), np.concatenate([paths.col, paths.row]),
                   np.concatenate([paths.data, paths.data]), n)
    keep = sym.row != sym.col
    return PositivePairs(rows=sym.row[keep].astype(np.int64), cols=sym.col[keep].astype(np.int64),
                         weights=sym.data[keep].astype(np.float64), n_nodes=n)


def _max_coo(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n: int) -> sp.coo_matrix:
    """COO matrix keeping the maximum value of duplicate (row, col) entries, sorted by (row, col)."""
    if rows.size == 0:
        return sp.coo_matrix((n, n))
    key = rows.astype(np.int64) * n + cols.astype(np.int64)
    order = np.lexsort((-vals, key))  # by key, then largest value first
    key, vals = key[order], vals[order]
    first = np.ones(key.size, dtype=bool)
    first[1:] = key[1:] != key[:-1]
    key, vals = key[first], vals[first]
    return sp.coo_matrix((vals, (key // n, key % n)), shape=(n, n))
