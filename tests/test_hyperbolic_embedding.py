"""Step II embedding: stays on the hyperboloid, deterministic, recovers DAG structure, rejects bad input."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from cape import CapeInputError
from cape.bench.embedding import barabasi_albert_dag, embedding_fidelity
from cape.hyperbolic import embed_dag, hyperboloid_residual


def random_dag(n: int, p: float, rng: np.random.Generator) -> sp.csr_matrix:
    upper = np.triu(rng.random((n, n)) < p, k=1) * rng.uniform(0.2, 2.0, (n, n))
    perm = rng.permutation(n)
    return sp.csr_matrix(upper[np.ix_(perm, perm)])


def chain(n: int) -> sp.csr_matrix:
    return sp.csr_matrix((np.ones(n - 1), (np.arange(n - 1), np.arange(1, n))), shape=(n, n))


def star(n_leaves: int) -> sp.csr_matrix:
    return sp.csr_matrix((np.ones(n_leaves), (np.zeros(n_leaves, dtype=int), np.arange(1, n_leaves + 1))),
                         shape=(n_leaves + 1, n_leaves + 1))


def assert_valid(result, dim: int) -> None:
    points = torch.from_numpy(result.points)
    assert points.shape[1] == dim + 1
    assert np.isfinite(result.points).all() and np.isfinite(result.poincare).all()
    assert float(hyperboloid_residual(points).max()) < 1e-9
    assert np.all(result.points[:, 0] > 0)
    assert np.all(np.linalg.norm(result.poincare, axis=1) < 1)


def test_no_nan_and_on_manifold_over_100_random_graphs():
    rng = np.random.default_rng(0)
    graphs = [("chain500", chain(500), None), ("star1000", star(1000), 32)]
    for i in range(98):
        n = int(rng.integers(2, 40))
        graphs.append((f"random{i}", random_dag(n, float(rng.uniform(0.02, 0.6)), rng), None))
    for i, (_name, adj, negatives) in enumerate(graphs):
        dim = int(rng.integers(2, 9))
        # Large learning rates on purpose: points must hit the radius limit and stay exactly on the manifold.
        lr = float(rng.choice([0.05, 1.0, 5.0]))
        result = embed_dag(adj, dim=dim, epochs=15 if i < 2 else 10, lr=lr, negatives=negatives, seed=i,
                           show_progress=False)
        assert_valid(result, dim)
        assert np.isfinite(result.losses).all()
        assert np.arccosh(result.points[:, 0]).max() <= 7.0 + 1e-9


def test_same_seed_same_result_and_seed_matters():
    adj = barabasi_albert_dag(30, 2, seed=1)
    a = embed_dag(adj, dim=4, epochs=30, seed=3, show_progress=False)
    b = embed_dag(adj, dim=4, epochs=30, seed=3, show_progress=False)
    c = embed_dag(adj, dim=4, epochs=30, seed=4, show_progress=False)
    np.testing.assert_array_equal(a.points, b.points)
    assert not np.allclose(a.points, c.points)
    s1 = embed_dag(adj, dim=4, epochs=30, seed=3, negatives=8, show_progress=False)
    s2 = embed_dag(adj, dim=4, epochs=30, seed=3, negatives=8, show_progress=False)
    np.testing.assert_array_equal(s1.points, s2.points)


@pytest.mark.parametrize("optimizer", ["rsgd", "radam"])
def test_loss_decreases_and_structure_is_recovered(optimizer):
    adj = barabasi_albert_dag(60, 2, seed=2)
    result = embed_dag(adj, dim=4, epochs=300, optimizer=optimizer, show_progress=False)
    assert result.losses[-1] < 0.7 * result.losses[0]
    fid = embedding_fidelity(result.points, result.poincare, adj, result.generality, tie_draws=5)
    assert fid["map"] > fid["oracle_map_pessimistic"]
    assert fid["spearman"] > 0.4


def test_euclidean_ablation_shapes_and_ball():
    adj = barabasi_albert_dag(30, 2, seed=0)
    result = embed_dag(adj, dim=3, epochs=50, geometry="euclidean", show_progress=False)
    assert result.points.shape == (30, 3) and result.geometry == "euclidean"
    assert np.linalg.norm(result.poincare, axis=1).max() < 1
    # The ball positions are a uniform rescaling of the Euclidean points.
    ratio = result.poincare[result.embedded] / result.points[result.embedded]
    np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-12)


def test_root_is_more_general_and_closer_to_origin_on_a_tree():
    # binary tree of depth 4 oriented root -> leaves
    n = 31
    rows = (np.arange(1, n) - 1) // 2
    adj = sp.csr_matrix((np.ones(n - 1), (rows, np.arange(1, n))), shape=(n, n))
    result = embed_dag(adj, dim=2, epochs=400, show_progress=False)
    assert np.argmax(result.generality) == 0
    norms = np.linalg.norm(result.poincare, axis=1)
    leaves = np.arange(15, 31)
    assert norms[0] < norms[leaves].min()


def test_empty_graph_puts_everything_at_origin_with_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="cape"):
        result = embed_dag(np.zeros((5, 5)), dim=3, epochs=10, show_progress=False)
    assert "no edges" in caplog.text
    np.testing.assert_array_equal(result.points, np.tile([1.0, 0, 0, 0], (5, 1)))
    np.testing.assert_array_equal(result.poincare, 0.0)
    assert not result.embedded.any()
    np.testing.assert_allclose(result.generality, 0.2)


def test_disconnected_components_and_isolated_nodes():
    adj = sp.lil_matrix((8, 8))
    adj[0, 1] = adj[1, 2] = 1.0  # component A
    adj[3, 4] = adj[3, 5] = 1.0  # component B; nodes 6, 7 isolated
    result = embed_dag(adj.tocsr(), dim=2, epochs=200, show_progress=False)
    assert_valid(result, 2)
    np.testing.assert_array_equal(result.embedded, [True] * 6 + [False] * 2)
    np.testing.assert_array_equal(result.poincare[6:], 0.0)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"dim": 1}, "dim must be an integer ≥ 2"),
    ({"geometry": "spherical"}, "geometry"),
    ({"optimizer": "lbfgs"}, "optimizer"),
    ({"negatives": 0}, "negatives"),
    ({"k_hop": 0}, "k_hop"),
    ({"restart": 1.5}, "restart"),
])
def test_bad_parameters_are_rejected(kwargs, match):
    with pytest.raises(CapeInputError, match=match):
        embed_dag(chain(4), epochs=1, show_progress=False, **kwargs)


def test_cyclic_and_non_square_adjacency_rejected():
    cyc = sp.csr_matrix(([1.0, 1.0], ([0, 1], [1, 0])), shape=(3, 3))
    with pytest.raises(CapeInputError, match="directed cycle: a -> b -> a"):
        embed_dag(cyc, names=["a", "b", "c"], epochs=1, show_progress=False)
    with pytest.raises(CapeInputError, match="square"):
        embed_dag(np.zeros((2, 3)), epochs=1, show_progress=False)
