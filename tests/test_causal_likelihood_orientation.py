"""cape.causal.orient_by_likelihood: turns that the Gaussian likelihood supports, on a fixed skeleton."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from cape.causal import family_log_variance, orient_by_likelihood


def _linear_sem(edges: dict[tuple[int, int], float], m: int, n: int = 3000, seed: int = 0) -> np.ndarray:
    """Cells of a linear SEM with unit noise, genes in index order (every edge i → j has i < j)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, m))
    for j in range(m):
        for (i, k), w in edges.items():
            if k == j:
                X[:, j] += w * X[:, i]
    return X


def _dag(m: int, edges) -> np.ndarray:
    D = np.zeros((m, m))
    for i, j in edges:
        D[i, j] = 0.5 + 0.1 * i + 0.01 * j  # distinct weights, to follow each one through a turn
    return D


def test_a_wrongly_pointed_v_structure_is_turned_with_its_weight():
    X = _linear_sem({(0, 2): 0.8, (1, 2): 0.8}, 3)  # 0 → 2 ← 1
    start = _dag(3, [(2, 0), (1, 2)])  # the chain 1 → 2 → 0: equivalent to none of the truth's class
    out, turns = orient_by_likelihood(X, start)
    assert turns == 1
    assert out[0, 2] == start[2, 0] and out[2, 0] == 0 and out[1, 2] == start[1, 2]


@pytest.mark.parametrize("edges", [[(0, 1), (1, 2)], [(1, 0), (2, 1)], [(1, 0), (1, 2)]])
def test_no_turn_within_the_truths_equivalence_class(edges):
    # every chain and fork over 0 - 1 - 2 is Markov equivalent to the true chain 0 → 1 → 2: no turn gains
    X = _linear_sem({(0, 1): 0.8, (1, 2): 0.8}, 3)
    out, turns = orient_by_likelihood(X, _dag(3, edges))
    assert turns == 0
    np.testing.assert_array_equal(out, _dag(3, edges))


def test_skeleton_weights_and_acyclicity_kept_on_a_random_graph():
    rng = np.random.default_rng(3)
    m = 12
    truth = {(i, j): rng.uniform(0.5, 1.0) for i in range(m) for j in range(i + 1, m) if rng.random() < 0.25}
    X = _linear_sem(truth, m, seed=1)
    order = rng.permutation(m)  # the start: the true skeleton pointed along a random order
    start = _dag(m, [(i, j) if order[i] < order[j] else (j, i) for i, j in truth])
    out, turns = orient_by_likelihood(X, start)
    assert turns > 0
    np.testing.assert_array_equal((out != 0) | (out != 0).T, (start != 0) | (start != 0).T)
    assert np.count_nonzero(out) == np.count_nonzero(start)
    np.testing.assert_array_equal(np.sort(np.maximum(out, out.T)[np.triu_indices(m, 1)]),
                                  np.sort(np.maximum(start, start.T)[np.triu_indices(m, 1)]))
    assert nx.is_directed_acyclic_graph(nx.DiGraph(out))


def test_standardising_makes_the_turns_blind_to_each_genes_scale():
    X = _linear_sem({(0, 2): 0.8, (1, 2): 0.8, (2, 3): 0.7}, 4, seed=2)
    start = _dag(4, [(2, 0), (1, 2), (3, 2)])
    out, turns = orient_by_likelihood(X, start)
    scaled, scaled_turns = orient_by_likelihood(X * np.array([10.0, 0.1, 3.0, 7.0]) + 5.0, start)
    assert turns == scaled_turns
    np.testing.assert_array_equal(out, scaled)


def test_the_test_level_gates_small_gains():
    X = _linear_sem({(0, 2): 0.8, (1, 2): 0.8}, 3, n=3000)
    start = _dag(3, [(2, 0), (1, 2)])
    assert orient_by_likelihood(X, start, level=1e-300)[1] == 0  # a gain no finite sample passes
    assert orient_by_likelihood(X, start, max_turns=0)[1] == 0


def test_family_log_variance_is_half_the_log_residual_variance():
    X = _linear_sem({(0, 1): 0.6}, 2, n=20000)
    Z = (X - X.mean(0)) / X.std(0)
    C = Z.T @ Z / len(Z)
    assert family_log_variance(C, 1, []) == pytest.approx(0.0, abs=1e-12)
    assert family_log_variance(C, 1, [0]) == pytest.approx(0.5 * np.log(1 - C[0, 1] ** 2))


def test_level_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match="level"):
        orient_by_likelihood(np.zeros((10, 2)), np.zeros((2, 2)), level=1.0)


def test_a_sparse_matrix_gives_the_dense_result():
    X = np.abs(_linear_sem({(0, 2): 0.8, (1, 2): 0.8}, 3))
    X[X < 0.5] = 0.0  # many zeros, as in counts
    start = _dag(3, [(2, 0), (1, 2)])
    dense_out, dense_turns = orient_by_likelihood(X, start)
    sparse_out, sparse_turns = orient_by_likelihood(sp.csr_matrix(X), start)
    assert dense_turns == sparse_turns
    np.testing.assert_array_equal(dense_out, sparse_out)


def _full_rescan(X, dag: np.ndarray, level: float = 0.05) -> tuple[np.ndarray, int]:
    """The search without its bookkeeping: every step scores every edge again and checks every path again."""
    from scipy.stats import chi2

    Z = (X - X.mean(0)) / X.std(0)
    C = Z.T @ Z / len(Z)
    min_gain = chi2.ppf(1 - level, 1) / (2 * len(Z))
    out, turns = dag.copy(), 0
    while True:
        graph = nx.DiGraph(list(zip(*np.nonzero(out), strict=True)))
        parents = {j: set(np.flatnonzero(out[:, j])) for j in range(len(out))}
        best, move = min_gain, None
        for i, j in sorted(graph.edges):
            before = family_log_variance(C, i, parents[i]) + family_log_variance(C, j, parents[j])
            gain = before - (family_log_variance(C, i, parents[i] | {j}) + family_log_variance(C, j, parents[j] - {i}))
            if gain > best:
                graph.remove_edge(i, j)
                if not nx.has_path(graph, i, j):
                    best, move = gain, (i, j)
                graph.add_edge(i, j)
        if move is None:
            return out, turns
        i, j = move
        out[j, i], out[i, j] = out[i, j], 0
        turns += 1


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_search_makes_the_turns_of_a_full_rescan_at_every_step(seed):
    # dense enough that paths block many of the best turns, and with equal gains (parentless parents of one child)
    rng = np.random.default_rng(seed)
    m = 16
    truth = {(i, j): rng.uniform(0.4, 1.0) for i in range(m) for j in range(i + 1, m) if rng.random() < 0.3}
    X = _linear_sem(truth, m, n=2000, seed=seed)
    order = rng.permutation(m)
    start = _dag(m, [(i, j) if order[i] < order[j] else (j, i) for i, j in truth])
    out, turns = orient_by_likelihood(X, start)
    expected, expected_turns = _full_rescan(X, start)
    assert turns == expected_turns > 0
    np.testing.assert_array_equal(out, expected)


def test_genes_off_the_graph_change_no_turn():
    # the search reads only the genes on edges: unlinked genes beside them leave the turns as they were
    X = _linear_sem({(0, 2): 0.8, (1, 2): 0.8, (2, 3): 0.7}, 4, seed=2)
    start = _dag(4, [(2, 0), (1, 2), (3, 2)])
    noise = np.random.default_rng(5).standard_normal((X.shape[0], 3))
    wide = np.zeros((7, 7))
    wide[np.ix_([0, 2, 4, 6], [0, 2, 4, 6])] = start
    out, turns = orient_by_likelihood(X, start)
    wide_out, wide_turns = orient_by_likelihood(np.column_stack([X[:, 0], noise[:, 0], X[:, 1], noise[:, 1], X[:, 2],
                                                                 noise[:, 2], X[:, 3]]), wide)
    assert wide_turns == turns > 0
    np.testing.assert_array_equal(wide_out[np.ix_([0, 2, 4, 6], [0, 2, 4, 6])], out)
    assert np.count_nonzero(wide_out) == np.count_nonzero(out)
