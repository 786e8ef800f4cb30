"""cape.causal.equivalence: CPDAG, IDA parent sets and effects, against brute-force enumeration of the class."""

from __future__ import annotations

from itertools import combinations, product

import networkx as nx
import numpy as np
import pytest
import torch

from cape.causal import cpdag, equivalence_class_effects, intervene_equivalence_class, local_parent_sets
from cape.causal.equivalence import TooManyParentSets, possible_descendants, total_effects


def _v_structures(D: np.ndarray) -> set[tuple[int, int, int]]:
    out = set()
    for k in range(len(D)):
        for a, b in combinations(np.flatnonzero(D[:, k]).tolist(), 2):
            if not (D[a, b] or D[b, a]):
                out.add((a, b, k))
    return out


def _class_members(D: np.ndarray) -> list[np.ndarray]:
    """Every DAG with D's skeleton and v-structures (Verma & Pearl: exactly D's Markov equivalence class)."""
    edges = list(zip(*np.nonzero(np.triu(D | D.T, 1)), strict=True))
    target, members = _v_structures(D), []
    for flips in product((False, True), repeat=len(edges)):
        E = np.zeros_like(D)
        for (a, b), flip in zip(edges, flips, strict=True):
            E[(b, a) if flip else (a, b)] = True
        if nx.is_directed_acyclic_graph(nx.DiGraph(E)) and _v_structures(E) == target:
            members.append(E)
    return members


def _random_dag(rng, n: int, p: float) -> np.ndarray:
    perm = rng.permutation(n)
    return np.triu(rng.random((n, n)) < p, 1)[np.ix_(perm, perm)]


def test_cpdag_and_parent_sets_match_brute_force_enumeration():
    rng = np.random.default_rng(0)
    for _ in range(80):
        D = _random_dag(rng, int(rng.integers(3, 7)), float(rng.uniform(0.2, 0.7)))
        members = _class_members(D)
        C = cpdag(D)
        # i → j allowed by some member ⇔ C[i, j]; compelled edges are those every member shares
        np.testing.assert_array_equal(C, np.logical_or.reduce(members))
        for x in range(len(D)):
            realised = {tuple(np.flatnonzero(E[:, x]).tolist()) for E in members}
            assert set(local_parent_sets(C, x)) == realised
            for parents in realised:
                reach = possible_descendants(C, x, parents)
                for E in members:
                    if tuple(np.flatnonzero(E[:, x]).tolist()) == parents:
                        truth = np.zeros(len(D), dtype=bool)
                        truth[list(nx.descendants(nx.DiGraph(E), x))] = True
                        assert not (truth & ~reach).any()  # a superset of the member's descendants


def test_chain_is_undirected_and_collider_compelled():
    chain = np.zeros((3, 3))
    chain[0, 1] = chain[1, 2] = 1
    C = cpdag(chain)
    assert C[0, 1] and C[1, 0] and C[1, 2] and C[2, 1]
    assert local_parent_sets(C, 1) == [(), (0,), (2,)]  # not (0, 2): that would be a new v-structure
    collider = np.zeros((3, 3))
    collider[0, 2] = collider[1, 2] = 1
    C = cpdag(collider)
    assert C[0, 2] and not C[2, 0] and C[1, 2] and not C[2, 1]
    assert local_parent_sets(C, 2) == [(0, 1)]
    with pytest.raises(ValueError, match="both directions"):
        cpdag(np.ones((2, 2)))


def test_total_effects_recover_a_linear_sem_and_ida_averages_the_orientations():
    rng = np.random.default_rng(1)
    n = 20000
    a = rng.normal(size=n)
    b = 0.8 * a + 0.6 * rng.normal(size=n)
    c = -0.5 * b + 0.5 * rng.normal(size=n)
    X = np.column_stack([a, b, c])
    np.testing.assert_allclose(total_effects(X, 0, ()), [1.0, 0.8, -0.4], atol=0.02)
    np.testing.assert_allclose(total_effects(X, 1, (0,)), [0.0, 1.0, -0.5], atol=0.02)
    dag = np.zeros((3, 3))
    dag[0, 1] = dag[1, 2] = 1
    effects, sets = equivalence_class_effects(X, dag, 1)
    assert sets == [(), (0,), (2,)]
    # B's parent set (C,): B → A only, C is a parent, so B moves A and nothing else
    by_set = dict(zip(sets, effects, strict=True))
    assert by_set[(2,)][2] == 0.0 and by_set[(0,)][0] == 0.0
    np.testing.assert_allclose(by_set[(0,)][2], -0.5, atol=0.02)


def test_intervene_counterfactual_is_exact_for_one_member_and_keeps_non_descendants():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(500, 4))
    X[:, 1] += 2 * X[:, 0]
    dag = np.zeros((4, 4))
    dag[0, 1] = dag[2, 1] = 1.0  # a collider: compelled, one member, one parent set
    predicted, reference, effects, sets = intervene_equivalence_class(X, dag, 1, 3.0)
    assert sets == [(0, 2)] and np.array_equal(reference, X) and effects.shape == (1, 4)
    np.testing.assert_array_equal(predicted[:, [0, 2, 3]], X[:, [0, 2, 3]])  # parents, unrelated: bit for bit
    assert (predicted[:, 1] == 3.0).all()
    same, _, _, _ = intervene_equivalence_class(X, dag, 0, X[:, 0])  # do(observed) changes nothing
    np.testing.assert_allclose(same, X, atol=1e-12)
    cells, ref, _, _ = intervene_equivalence_class(X, dag, 1, 3.0, mode="interventional", n_cells=50, seed=3)
    again, _, _, _ = intervene_equivalence_class(X, dag, 1, 3.0, mode="interventional", n_cells=50, seed=3)
    assert cells.shape == (50, 4) and np.array_equal(cells, again)
    assert all((X == row).all(1).any() for row in ref)  # drawn observed cells
    np.testing.assert_array_equal(cells[:, [0, 2, 3]], ref[:, [0, 2, 3]])
    with pytest.raises(ValueError, match="mode"):
        intervene_equivalence_class(X, dag, 1, 3.0, mode="observational")


def test_a_hub_enumerates_cliques_not_subsets_and_a_dense_class_is_refused():
    # 40 undirected neighbours, pairwise non-adjacent except one pair: 1 + 40 + 1 sets, not 2^40
    star = np.zeros((41, 41))
    star[0, 1:] = 1
    star[1, 2] = 1
    sets = local_parent_sets(cpdag(star), 0)
    assert len(sets) == 42 and (1, 2) in sets and sets[0] == ()
    complete = np.triu(np.ones((8, 8)), 1)  # every orientation order is a member: 2^7 parent sets of node 0
    assert len(local_parent_sets(cpdag(complete), 0)) == 2**7
    with pytest.raises(TooManyParentSets, match="more than 100 possible parent sets"):
        local_parent_sets(cpdag(complete), 0, max_sets=100)


def test_parents_mlp_fits_whatever_torch_default_dtype():
    from cape.causal import fit_parents_mlp
    X = np.random.default_rng(0).normal(size=(200, 4))
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)  # what importing gcastle's algorithms does
        f64 = fit_parents_mlp(X, screen_steps=3, steps=3, device="cpu")
    finally:
        torch.set_default_dtype(default)
    np.testing.assert_array_equal(f64.adjacency, fit_parents_mlp(X, screen_steps=3, steps=3, device="cpu").adjacency)


def test_total_effects_equal_the_full_regression_coefficient():
    # Frisch–Waugh–Lovell: r·x_k / r·r is the coefficient of x_gene in the regression of x_k on (1, x_gene, x_P)
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 7)) + rng.normal(size=7)
    X[:, 3] += X[:, 1] - 0.5 * X[:, 2]
    X[:, 5] += 0.7 * X[:, 3]
    for parents in [(), (1,), (1, 2), (0, 2, 6)]:
        design = np.column_stack([X[:, [3, *parents]], np.ones(len(X))])
        expected = np.linalg.lstsq(design, X, rcond=None)[0][0]
        expected[list(parents)], expected[3] = 0.0, 1.0
        np.testing.assert_allclose(total_effects(X, 3, parents), expected, atol=1e-10)
    collinear = X.copy()
    collinear[:, 3] = 2 * collinear[:, 1]
    with pytest.raises(ValueError, match="linear function of its parent set"):
        total_effects(collinear, 3, (1,))
