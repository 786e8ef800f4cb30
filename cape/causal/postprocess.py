"""From a learnt weighted adjacency to a guaranteed DAG: threshold at τ, then break cycles, weakest edges first."""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
from scipy.stats import norm

from .._arrays import add_to_diagonal, dense, float64_on, namespace, to_numpy
from .confidence import MIN_DETECTED_CELLS, cell_states, effective_cells

__all__ = [
    "AUTO_TAU_FLOOR",
    "AUTO_TAU_MAX",
    "BUDGET_CELLS",
    "BUDGET_CELLS_PER_GENE",
    "BUDGET_FDR",
    "BUDGET_FILL_FDR",
    "BUDGET_MIN_EXTRA_CELLS",
    "BUDGET_TEST",
    "BUDGET_TESTS",
    "BUDGET_TEST_NAMES",
    "MIN_DETECTED_CELLS",
    "SCREEN_FDR",
    "BudgetCount",
    "budget_rows",
    "budget_tests",
    "choose_tau",
    "count_budget",
    "decoy_count",
    "decoy_counts",
    "edge_budget",
    "fill_budget",
    "is_dag",
    "make_dag",
    "orient_acyclic",
    "partial_correlation_tests",
    "partial_correlations",
    "permuted_genes",
    "positioned_genes",
    "robust_partial_correlation_tests",
    "screen_candidates",
    "state_partial_correlation_tests",
    "tau_for_edges",
    "tau_positioning",
    "threshold",
]

#: ``tau="auto"`` never goes above the paper's τ: where 0.2 already positions enough genes, it is 0.2.
AUTO_TAU_MAX = 0.2
#: ``tau="auto"`` never goes below this: Adam moves every weight by about lr (3e-3) per step, so weights
#: without support hover at that scale (a fit on gene-wise shuffled data tops out near 0.003).
AUTO_TAU_FLOOR = 0.01
#: ``tau="budget"``: false discovery rate of the partial-correlation tests that set the number of edges; chosen among
#: 1, 5, 10, 20 and 30 % on held-out seeds of the count panel, four simulators not written around Step I
#: (docs/benchmarks/count_panel.md; 30 % had been chosen on simulate_grn_cells alone) ...
BUDGET_FDR = 0.05
#: ... and where fewer pairs than genes pass that rate, the budget takes up to one pair per gene from those passing at
#: this looser one (:func:`fill_budget`): a graph of fewer than M − 1 edges cannot give every gene a position, and on
#: the count panel's sparse settings (low depth, strong dispersion, SERGIO's DS3, simulate_grn_cells' control cells)
#: the pairs kept at 5 % are mostly right while the F1-best cut lies far past them (docs/benchmarks/count_panel.md).
BUDGET_FILL_FDR = 0.2
#: ... which need at least this many cells beyond the number of genes (their degrees of freedom are n − M − 1).
BUDGET_MIN_EXTRA_CELLS = 10
#: The budget's test counts on at most max(BUDGET_CELLS, BUDGET_CELLS_PER_GENE · M) cells, a seeded random subset
#: (:func:`budget_rows`): the rate was chosen on 2,000 cells of 200 genes, and on many more cells weak partial
#: correlations between genes without an edge become significant, so that the count grows with the cells rather
#: than with the edges (docs/benchmarks/step1_counts.md).
BUDGET_CELLS = 2000
BUDGET_CELLS_PER_GENE = 10
#: How the budget's test judges a pair (:func:`budget_tests`): ``"both"`` (the default: Fisher's z and the robust
#: test must agree), ``"fisher"`` (:func:`partial_correlation_tests`), ``"robust"``
#: (:func:`robust_partial_correlation_tests`) or ``"state"`` (:func:`state_partial_correlation_tests`, within cell
#: states). Fisher's z assumes one variance per gene: where cell types switch genes on and off, or dropout and
#: library size make a gene's spread change from cell to cell, it calls many pairs of independent genes significant.
#: The robust test allows for that, but on genes detected in few cells its sandwich variance is too small; only the
#: two together held the rate on every null tried, and on count simulators written by others they size the graph
#: closer to the true network than Fisher's count, at the same F1 (docs/benchmarks/count_panel.md).
BUDGET_TESTS = ("both", "robust", "fisher", "state")
BUDGET_TEST = "both"
#: Each test in words, for logs and reports.
BUDGET_TEST_NAMES = {"both": "Fisher's z and the robust test", "robust": "robust test", "fisher": "Fisher's z",
                     "state": "Fisher's z within cell states"}
#: Cells per block of the robust test's residuals (memory: a block × genes array of float64).
_ROBUST_BLOCK_CELLS = 4096
#: Candidate parents for a dense A (:func:`screen_candidates`): pairs significant at this looser false discovery rate.
SCREEN_FDR = 0.2


def threshold(A: np.ndarray, tau: float) -> np.ndarray:
    """A ∘ 1(|A| > τ) with the diagonal cleared (self-loops are never causal edges here)."""
    if not np.isfinite(tau) or tau < 0:
        raise ValueError(f"tau must be a finite number ≥ 0, got {tau}")
    out = np.where(np.abs(A) > tau, A, 0.0).astype(A.dtype, copy=False)
    np.fill_diagonal(out, 0.0)
    return out


def is_dag(A: np.ndarray) -> bool:
    """Whether the nonzero pattern of A (A[i, j] ≠ 0: i → j) has no directed cycle (self-loops included)."""
    A = np.asarray(A)
    if np.any(np.diag(A) != 0):
        return False
    return nx.is_directed_acyclic_graph(nx.from_numpy_array((A != 0).astype(np.int8), create_using=nx.DiGraph))


def make_dag(A: np.ndarray, tau: float = 0.0) -> tuple[np.ndarray, int]:
    """Threshold A at τ, then break the remaining cycles, dropping weak edges first.

    Edges between strongly connected components never lie on a cycle and are all kept. Inside each
    component the edges are inserted one by one by decreasing |weight| (ties: by index), and an edge is
    dropped when the edges kept so far already lead from its head back to its tail, i.e. when it would close
    a cycle of heavier edges. Reachability inside the component is a boolean matrix updated on each insertion
    that adds new reachable pairs, so a check is O(1) and the work grows with the closure, not with the number
    of cycles (the former one-cycle-at-a-time removal did not finish on 300 near-dense genes at τ = 0).

    The result is always a DAG and is maximal: re-adding any dropped edge would close a cycle. A thresholded
    graph that is already a DAG is returned unchanged, and every gene with an edge above τ keeps at least one
    (its heaviest edge inside its component always goes in). Returns the DAG (same dtype, weights of kept
    edges unchanged) and the number of edges removed by cycle breaking (not counting those below τ).
    """
    out = threshold(np.asarray(A), tau)
    u, _ = _cycle_closing_edges(out)
    return out, int(u.size)


def orient_acyclic(chosen: np.ndarray, A: np.ndarray, floor: float) -> tuple[np.ndarray, int, int]:
    """The edges of ``chosen`` (at most one direction per gene pair, with its weight) made a DAG by turning edges
    round rather than dropping them.

    Inside each strongly connected component the edges go in by decreasing |weight| (ties: by index), as in
    :func:`make_dag`. An edge u → v that would close a cycle of heavier kept edges goes in as v → u with A's weight
    that way, which never closes one (the kept edges are acyclic and already lead from v to u); where |A[v, u]| is
    at or below ``floor`` the fit gives that direction no equation, and the edge is dropped instead. Every gene pair
    of ``chosen`` is kept but those. Returns the DAG, the number of edges turned and the number dropped.
    """
    out = threshold(np.asarray(chosen), 0.0)
    A = np.asarray(A)
    if A.shape != out.shape:
        raise ValueError(f"A is {A.shape} but the chosen edges are {out.shape}")
    # A turned edge v → u adds no path (v already led to u), so the edges that close a cycle are make_dag's.
    u, v = _cycle_closing_edges(out)
    turn = np.abs(A[v, u]) > floor
    out[v[turn], u[turn]] = A[v[turn], u[turn]]
    return out, int(turn.sum()), int((~turn).sum())


def _cycle_closing_edges(out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Remove from ``out`` (in place) the edges that close a cycle of heavier ones, and return them as (tails, heads).

    Edges between strongly connected components never lie on a cycle; inside each component the edges go in by
    decreasing |weight| (ties: by index), and an edge goes out when the kept ones already lead from its head back to
    its tail.
    """
    support = sp.csr_matrix(out != 0)
    n_components, labels = connected_components(support, directed=True, connection="strong")
    sizes = np.bincount(labels, minlength=n_components)
    tails, heads = [], []
    for component in np.flatnonzero(sizes > 1):
        nodes = np.flatnonzero(labels == component)
        sub = out[np.ix_(nodes, nodes)]
        rows, cols = np.nonzero(sub)
        order = np.lexsort((cols, rows, -np.abs(sub[rows, cols])))
        u, v = nodes[rows[order]], nodes[cols[order]]
        closing = _greedy_acyclic(nodes.size, rows[order], cols[order])
        tails.append(u[closing])
        heads.append(v[closing])
    u = np.concatenate(tails) if tails else np.zeros(0, dtype=np.int64)
    v = np.concatenate(heads) if heads else np.zeros(0, dtype=np.int64)
    out[u, v] = 0
    return u, v


def _greedy_acyclic(n: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Boolean mask of the edges (in the given priority order) that would close a cycle of earlier kept ones."""
    reach = np.eye(n, dtype=bool)  # reach[x, y]: y is reachable from x through kept edges
    drop = np.zeros(rows.size, dtype=bool)
    for k, (u, v) in enumerate(zip(rows.tolist(), cols.tolist(), strict=True)):
        if reach[v, u]:
            drop[k] = True
        elif not reach[u, v]:
            # u → v is new: everything reaching u now reaches all that v reaches.
            reach[reach[:, u]] |= reach[v]
    return drop


def positioned_genes(A: np.ndarray, tau: float = 0.0) -> np.ndarray:
    """Boolean mask of the genes with at least one off-diagonal edge |A_ij| > τ, in or out.

    :func:`make_dag` keeps at least one edge of each such gene, so this is also the set of genes that get an
    edge in ``make_dag(A, tau)``, without building it.
    """
    above = np.abs(np.asarray(A)) > tau
    np.fill_diagonal(above, False)
    return above.any(axis=0) | above.any(axis=1)


def tau_positioning(A: np.ndarray, fraction: float) -> float:
    """The largest τ at which at least ``ceil(fraction · M)`` genes keep an edge (``positioned_genes``).

    That is just below the k-th largest per-gene strongest |weight| (computed in A's dtype, so that the
    comparison ``|A| > τ`` in :func:`threshold` holds for that weight). 0.0 when no gene has a nonzero edge.
    """
    A = np.asarray(A)
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    strength = np.abs(A).astype(A.dtype if np.issubdtype(A.dtype, np.floating) else np.float64)
    np.fill_diagonal(strength, 0)
    per_gene = np.sort(np.maximum(strength.max(axis=0), strength.max(axis=1)))[::-1]
    k = max(1, int(np.ceil(fraction * per_gene.size)))
    value = per_gene[k - 1]
    return float(np.nextafter(value, value.dtype.type(0))) if value > 0 else 0.0


def choose_tau(A: np.ndarray, tau: float | str, min_positioned: float, budget: int | None = None) -> tuple[float, str]:
    """The threshold to use and how it was chosen (``"fixed"``, ``"budget"``, ``"auto: paper"``,
    ``"auto: positioning"``).

    ``tau="budget"`` with ``budget`` = K (:func:`edge_budget`): keep the K heaviest weights (:func:`tau_for_edges`),
    but none at or below :data:`AUTO_TAU_FLOOR`; with ``budget=None`` (too few cells for the test) it falls back
    to the ``"auto"`` rule. ``tau="auto"``: :data:`AUTO_TAU_MAX` where it already gives an edge to at least
    ``min_positioned`` of the genes, else the largest τ that does, but not below :data:`AUTO_TAU_FLOOR` (the rule
    of :func:`cape.tl.causal_graph` before the budget).
    """

    if tau == "budget" and budget is not None:
        return max(tau_for_edges(A, budget), AUTO_TAU_FLOOR), "budget"
    if tau not in ("auto", "budget"):
        return float(tau), "fixed"
    if positioned_genes(A, AUTO_TAU_MAX).mean() >= min_positioned:
        return AUTO_TAU_MAX, "auto: paper"
    # The largest τ that still positions the requested fraction, but never into the optimiser's noise.
    return max(tau_positioning(A, min_positioned), AUTO_TAU_FLOOR), "auto: positioning"

def covariance(X, device=None, ddof: int = 1):
    """M×M covariance of the columns of X (cells × genes, dense or sparse), with ``ddof`` degrees of freedom lost.

    ``device``: ``None`` for NumPy's :func:`numpy.cov` (a NumPy array), or a torch device on which to compute it
    (a float64 tensor there): the pipeline's CUDA runs keep the genes' covariance algebra on the card."""
    if device is None:
        return np.atleast_2d(np.cov(dense(X), rowvar=False, ddof=ddof))
    X = float64_on(X, device)
    centred = X - X.mean(axis=0)
    return centred.T @ centred / (X.shape[0] - ddof)


def partial_correlations(X, device=None) -> np.ndarray:
    """M×M partial correlations of the columns of X given all other columns (zero diagonal), from the inverse of
    the covariance (with a ridge of 1e-8 of its mean variance, so that collinear genes do not break it).
    ``device``: as for :func:`covariance`."""
    cov = covariance(X, device)
    add_to_diagonal(cov, 1e-8 * max(float(cov.diagonal().mean()), 1e-300))
    precision = namespace(device).linalg.inv(cov)
    d = precision.diagonal().clip(1e-300, None) ** 0.5
    R = to_numpy(-precision / (d[:, None] * d[None, :]))
    np.fill_diagonal(R, 0.0)
    return R


def partial_correlation_tests(X, device=None) -> tuple[np.ndarray, np.ndarray] | None:
    """Every gene pair's two-sided p-value for a zero partial correlation (Fisher's z, z = atanh(abs(r))·√(n − M − 1));
    ``device`` as for :func:`covariance`.

    Returns ``(pairs, p)``: the upper-triangle index arrays (i < j) and their p-values; ``None`` when X has fewer
    than M + :data:`BUDGET_MIN_EXTRA_CELLS` cells (too few degrees of freedom) or fewer than 2 genes.
    """
    n, m = X.shape
    if m < 2 or n < m + BUDGET_MIN_EXTRA_CELLS:
        return None
    R = partial_correlations(X, device)
    pairs = np.triu_indices(m, 1)
    z = np.arctanh(np.clip(np.abs(R[pairs]), 0.0, 1.0 - 1e-12)) * np.sqrt(n - m - 1)
    return pairs, 2.0 * norm.sf(z)


def state_partial_correlation_tests(X, seed: int = 0) -> tuple[np.ndarray, np.ndarray] | None:
    """Fisher's z for every gene pair's partial correlation given the other genes *and the cell state*.

    The states are :func:`cape.causal.cell_states` (Leiden clusters of the cells, seeded by ``seed``); each gene is
    centred within each state, which regresses the state indicators out of every gene (Frisch–Waugh–Lovell), and the
    test loses one degree of freedom per state beyond the first: z = atanh(|r|)·√(n − M − S). Two genes that merely
    differ between cell types, independent within each, are then not called dependent. ``None`` as for
    :func:`partial_correlation_tests` (with S − 1 more cells needed).
    """
    n, m = X.shape
    states = cell_states(X, seed=seed)
    _, index, counts = np.unique(states, return_inverse=True, return_counts=True)
    n_states = int(counts.size)
    if m < 2 or n < m + n_states - 1 + BUDGET_MIN_EXTRA_CELLS:
        return None
    Xd = np.asarray(X.toarray() if sp.issparse(X) else X, dtype=np.float64)
    sums = np.zeros((n_states, m))
    np.add.at(sums, index.ravel(), Xd)
    R = partial_correlations(Xd - (sums / counts[:, None])[index.ravel()])
    pairs = np.triu_indices(m, 1)
    z = np.arctanh(np.clip(np.abs(R[pairs]), 0.0, 1.0 - 1e-12)) * np.sqrt(n - m - n_states)
    return pairs, 2.0 * norm.sf(z)


def robust_partial_correlation_tests(X, min_detected: int = MIN_DETECTED_CELLS, device=None
                                     ) -> tuple[np.ndarray, np.ndarray] | None:
    """Every gene pair's two-sided p-value for a zero partial correlation, with a variance that allows each cell its
    own (a heteroscedasticity-robust, sandwich test).

    With e_i each gene's least-squares residual on all the other genes (e_i = X̃Θ_{·i}/Θ_ii, X̃ the centred data,
    Θ the inverse covariance), the sample partial correlation is ∓corr(e_i, e_j), and

        T_ij = Σ_c e_ci·e_cj / √(Σ_c e_ci²·e_cj²) · √((n − M − 1)/n)  ~  N(0, 1)

    under the null hypothesis, whether or not the genes' variances change from cell to cell. The factor makes T as
    wide as Fisher's z on homoscedastic Gaussian data (the residuals have n − M degrees of freedom). Fisher's z
    (:func:`partial_correlation_tests`) assumes one variance per gene: where cell types switch genes on and off,
    genes independent within every type get p-values far too small.

    Pairs with a gene whose variance rests on fewer than ``min_detected`` cells ((Σ x²)² / Σ x⁴ of its centred
    values: k for a gene detected in k cells) are not tested (p = NaN): with so few cells the sums have no normal
    limit, and the sandwich variance is far too small. Returns ``(pairs, p)`` as :func:`partial_correlation_tests` does,
    ``None`` under the same conditions. ``device``: as for :func:`covariance`.
    """
    n, m = X.shape
    if m < 2 or n < m + BUDGET_MIN_EXTRA_CELLS:
        return None
    X = float64_on(X, device)
    centred = X - X.mean(axis=0)
    cov = centred.T @ centred / (n - 1)
    add_to_diagonal(cov, 1e-8 * max(float(cov.diagonal().mean()), 1e-300))
    precision = namespace(device).linalg.inv(cov)
    to_residuals = precision / precision.diagonal().clip(1e-300, None)
    cross = squares = 0.0
    for start in range(0, n, _ROBUST_BLOCK_CELLS):  # in blocks of cells: no n × M residual array at once
        residuals = centred[start:start + _ROBUST_BLOCK_CELLS] @ to_residuals
        cross = cross + residuals.T @ residuals
        residuals **= 2
        squares = squares + residuals.T @ residuals
    pairs = np.triu_indices(m, 1)
    cross, squares = to_numpy(cross), to_numpy(squares)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = cross[pairs] / np.sqrt(squares[pairs]) * np.sqrt((n - m - 1) / n)
    p = 2.0 * norm.sf(np.abs(z))
    cells = effective_cells(centred)
    p[(cells[pairs[0]] < min_detected) | (cells[pairs[1]] < min_detected) | ~np.isfinite(z)] = np.nan
    return pairs, p


def budget_tests(X, test: str = BUDGET_TEST, fisher: tuple | None = None, device=None
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """The budget's p-value for every gene pair, by ``test`` (:data:`BUDGET_TESTS`); ``None`` as for the tests.

    ``"both"``: the larger of Fisher's and the robust test's p-values, so a pair counts only where both call it
    significant; a pair the robust test leaves out (a gene detected in too few cells) stays untested (NaN). The
    larger p-value is valid wherever either test is. ``fisher``: :func:`partial_correlation_tests` (X) if already
    made (the screen's), not made again. ``device``: as for :func:`covariance` (Fisher's and the robust test).
    """
    if test not in BUDGET_TESTS:
        raise ValueError(f"test must be one of {', '.join(BUDGET_TESTS)}, got {test!r}")
    if test == "fisher":
        return fisher if fisher is not None else partial_correlation_tests(X, device)
    if test == "state":
        return state_partial_correlation_tests(X)
    robust = robust_partial_correlation_tests(X, device=device)
    if test == "robust" or robust is None:
        return robust
    fisher = fisher if fisher is not None else partial_correlation_tests(X, device)
    return robust[0], np.maximum(fisher[1], robust[1])  # NaN (not tested) stays NaN


def _bh_count(p: np.ndarray, fdr: float) -> int:
    """Number of hypotheses Benjamini–Hochberg rejects at ``fdr`` (NaN p-values: pairs not tested, not counted)."""
    if not 0 < fdr < 1:
        raise ValueError(f"fdr must be in (0, 1), got {fdr}")
    p = np.asarray(p)
    ranked = np.sort(p[np.isfinite(p)])
    passed = np.flatnonzero(ranked <= fdr * np.arange(1, ranked.size + 1) / max(ranked.size, 1))
    return int(passed[-1] + 1) if passed.size else 0


def edge_budget(X, fdr: float = BUDGET_FDR, tests: tuple | None = None, test: str = BUDGET_TEST,
                device=None) -> int | None:
    """How many gene pairs the data support: pairs whose partial correlation is significant at ``fdr``.

    Each pair's partial correlation (given every other gene) is tested by ``test`` (:func:`budget_tests`; by default
    Fisher's z), or pass a test's result as ``tests``, and the
    p-values of the pairs tested are cut by Benjamini–Hochberg. ``None``
    when X has fewer than M + :data:`BUDGET_MIN_EXTRA_CELLS` cells. The count is of gene pairs, the skeleton's
    edges: a graph thresholded to that many directed edges keeps about as many regulations as a
    partial-correlation network that controls its false discoveries. ``device``: as for :func:`covariance`.
    """
    tests = tests if tests is not None else budget_tests(X, test, device=device)
    return None if tests is None else _bh_count(tests[1], fdr)


def permuted_genes(X, seed: int = 0) -> np.ndarray:
    """A dense copy of X (cells × genes, dense or sparse) with each gene's column permuted over the cells on its own
    (``numpy.random.default_rng(seed)``): every gene keeps its values, and no gene depends on another."""
    X = dense(X, None)
    rng = np.random.default_rng(seed)
    out = np.empty_like(X)
    for j in range(X.shape[1]):  # gene by gene: one copy of X in memory, not a cells × genes index array besides
        out[:, j] = X[rng.permutation(X.shape[0]), j]
    return out


def decoy_count(X, fdr: float = BUDGET_FDR, test: str = BUDGET_TEST, seed: int = 0, device=None) -> int:
    """Pairs ``test`` calls significant at ``fdr`` on :func:`permuted_genes` (X): calls where no pair depends.

    A test that holds its level calls none or a few (Benjamini–Hochberg: none with probability ≥ 1 − ``fdr``). Many
    calls mean the test's null distribution does not fit these genes: Fisher's z on genes detected in a handful of
    cells, whose correlations are a few shared cells. 0 when X has too few cells for the test. ``device``: as for
    :func:`covariance`.
    """
    return decoy_counts(X, (fdr,), test, seed, device)[0]


def decoy_counts(X, fdrs: tuple[float, ...], test: str = BUDGET_TEST, seed: int = 0, device=None
                 ) -> tuple[int, ...]:
    """:func:`decoy_count` at each rate of ``fdrs``, from one permuted copy tested once."""
    tests = budget_tests(permuted_genes(X, seed), test, device=device)
    return tuple(0 if tests is None else _bh_count(tests[1], fdr) for fdr in fdrs)


def fill_budget(strict: int, loose: int, n_genes: int) -> int:
    """The edge budget from the strict count (pairs significant at :data:`BUDGET_FDR`) and the loose one (at
    :data:`BUDGET_FILL_FDR`), each net of its permuted copy: the strict count where it reaches ``n_genes``, else the
    strict count raised towards one pair per gene by the loose one, max(strict, min(``n_genes``, loose)).

    So the fill never takes the budget past one pair per gene, nor past the loose count.
    """
    if min(strict, loose, n_genes) < 0:
        raise ValueError(f"counts must be ≥ 0, got strict={strict}, loose={loose}, n_genes={n_genes}")
    return strict if strict >= n_genes else max(strict, min(n_genes, loose))


@dataclass(frozen=True)
class BudgetCount:
    """What :func:`count_budget` counted: pairs significant on the data and on the permuted copy, at the budget's
    rate and (``None`` where the fill is off) at the fill's (where the fill is needed, also given the cell states)."""

    n_genes: int
    significant: int
    permuted: int
    significant_fill: int | None = None
    permuted_fill: int | None = None

    @property
    def strict(self) -> int:
        """Pairs significant at the budget's rate, less the permuted copy's."""
        return max(self.significant - self.permuted, 0)

    @property
    def n_pairs(self) -> int:
        """The budget: :func:`fill_budget` of the two net counts, or the strict one without the fill."""
        if self.significant_fill is None:
            return self.strict
        return fill_budget(self.strict, max(self.significant_fill - (self.permuted_fill or 0), 0), self.n_genes)

    @property
    def filled(self) -> bool:
        """Whether the fill raised the budget past the strict count."""
        return self.n_pairs > self.strict


def count_budget(X, tests: tuple | None, fdr: float = BUDGET_FDR, fill_fdr: float | None = BUDGET_FILL_FDR,
                 test: str = BUDGET_TEST, seed: int = 0, device=None) -> BudgetCount | None:
    """``tau="budget"``'s count on X (the cells tested): pairs of ``tests`` (:func:`budget_tests` of X, made here
    when ``None``) significant at ``fdr`` and at ``fill_fdr`` (``None``: no fill), each less the pairs the same test
    calls on :func:`permuted_genes` (X) (seeded by ``seed``, one copy tested once, only where a pair passed);
    ``None`` where X has too few cells for the test. Where the fill is needed (fewer net pairs at ``fdr`` than
    genes), a pair counts at ``fill_fdr`` only where the test given the cell states passes it too; the permuted
    copy's count at ``fill_fdr`` stays the budget's test's, which calls at least as many. The budget itself is
    :attr:`BudgetCount.n_pairs`.
    """
    tests = tests if tests is not None else budget_tests(X, test, device=device)
    if tests is None:
        return None
    fdrs = (fdr,) if fill_fdr is None else (fdr, fill_fdr)
    significant = [_bh_count(tests[1], rate) for rate in fdrs]
    permuted = decoy_counts(X, fdrs, test, seed, device) if any(significant) else (0,) * len(fdrs)
    if fill_fdr is not None and significant[1] and significant[0] - permuted[0] < X.shape[1]:
        significant[1] = _fill_count(X, tests[1], fill_fdr, seed)
    fill = {} if fill_fdr is None else {"significant_fill": significant[1], "permuted_fill": permuted[1]}
    return BudgetCount(X.shape[1], significant[0], permuted[0], **fill)


def _fill_count(X, p: np.ndarray, fill_fdr: float, seed: int) -> int:
    """Pairs significant at ``fill_fdr`` by the budget's test (``p``) and by Fisher's z given the cell states
    (:func:`state_partial_correlation_tests`), p the larger of the two: cell types alone make many weak partial
    correlations past the budget's rate, which the fill would otherwise take for edges. The budget's test alone where
    the cells leave the state test no degrees of freedom."""
    state = state_partial_correlation_tests(X, seed=seed)
    return _bh_count(p if state is None else np.maximum(p, state[1]), fill_fdr)


def budget_rows(n_cells: int, n_genes: int, max_cells: int | None = BUDGET_CELLS,
                seed: int = 0) -> np.ndarray | None:
    """The cells :func:`edge_budget` tests on: ``None`` (all of them) when there are at most
    max(``max_cells``, :data:`BUDGET_CELLS_PER_GENE` · ``n_genes``) or ``max_cells`` is ``None``; else that many
    row indices, drawn without replacement by ``numpy.random.default_rng(seed)`` and sorted.
    """
    if max_cells is None:
        return None
    if max_cells < 1:
        raise ValueError(f"max_cells must be a positive number of cells or None, got {max_cells}")
    cap = max(int(max_cells), BUDGET_CELLS_PER_GENE * int(n_genes))
    if n_cells <= cap:
        return None
    return np.sort(np.random.default_rng(seed).choice(n_cells, cap, replace=False))


def screen_candidates(X, fdr: float = SCREEN_FDR, tests: tuple | None = None) -> np.ndarray | None:
    """Candidate edges for a dense A, SDCD-style: both directions of every pair significant at ``fdr`` (M×M bool).

    ``None`` without a test (see :func:`partial_correlation_tests`) or when no pair passes (then nothing is
    screened out).
    """
    tests = tests if tests is not None else partial_correlation_tests(X)
    if tests is None:
        return None
    (rows, cols), p = tests
    k = _bh_count(p, fdr)
    if k == 0:
        return None
    keep = p <= np.sort(p)[k - 1]
    m = X.shape[1]
    out = np.zeros((m, m), dtype=bool)
    out[rows[keep], cols[keep]] = True
    return out | out.T

def tau_for_edges(A: np.ndarray, k: int) -> float:
    """The largest τ at which ``threshold(A, τ)`` keeps (at least) the ``k`` heaviest off-diagonal weights.

    Just below the k-th largest ``|A_ij|`` (in A's dtype, so that ``|A| > τ`` keeps it); the largest weight itself when
    k = 0 (nothing is kept), 0.0 when A has fewer than k nonzero weights.
    """
    A = np.asarray(A)
    values = np.abs(A[~np.eye(A.shape[0], dtype=bool)]).astype(A.dtype if np.issubdtype(A.dtype, np.floating)
                                                                 else np.float64)
    if values.size == 0:
        return 0.0
    if k <= 0:
        return float(values.max())
    values = np.sort(values)[::-1]
    value = values[min(k, values.size) - 1]
    return float(np.nextafter(value, value.dtype.type(0))) if value > 0 else 0.0
