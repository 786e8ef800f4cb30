"""Step II cores: positives, generality, Poincaré maps, loss forms, adjacency validation."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cape import CapeInputError
from cape.hyperbolic import (
    check_dag,
    khop_positives,
    lorentz_distance,
    lorentz_to_poincare,
    pagerank_generality,
    poincare_distance,
    poincare_to_lorentz,
    strongest_path_products,
)
from cape.hyperbolic.adjacency import as_sparse_adjacency
from cape.hyperbolic.geometry import EuclideanGeometry, LorentzGeometry
from cape.hyperbolic.loss import (
    contrastive_terms,
    negative_logsumexp_exact,
    negative_logsumexp_sampled,
)


def random_dag(n: int, p: float, seed: int) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    upper = np.triu(rng.random((n, n)) < p, k=1)
    weights = rng.uniform(0.2, 3.0, (n, n)) * rng.choice([-1, 1], (n, n))
    perm = rng.permutation(n)
    dense = (upper * weights)[np.ix_(perm, perm)]
    return sp.csr_matrix(dense)


def brute_force_strongest_paths(adj: sp.csr_matrix, k: int) -> dict:
    graph = nx.DiGraph()
    coo = adj.tocoo()
    scale = np.abs(coo.data).max()
    graph.add_weighted_edges_from((int(i), int(j), abs(w) / scale)
                                  for i, j, w in zip(coo.row, coo.col, coo.data, strict=True))
    best: dict = {}
    for source in graph.nodes:
        for target in graph.nodes:
            if source == target:
                continue
            for path in nx.all_simple_paths(graph, source, target, cutoff=k):
                value = math.prod(graph[u][v]["weight"] for u, v in itertools.pairwise(path))
                best[(source, target)] = max(best.get((source, target), 0.0), value)
    return best


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 9), p=st.floats(0.1, 0.9), k=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_strongest_path_products_match_brute_force(n, p, k, seed):
    adj = random_dag(n, p, seed)
    if adj.nnz == 0:
        return
    expected = brute_force_strongest_paths(adj, k)
    got = strongest_path_products(adj, k).tocoo()
    got_dict = {(int(i), int(j)): float(v) for i, j, v in zip(got.row, got.col, got.data, strict=True)}
    assert got_dict.keys() == expected.keys()
    for key, value in expected.items():
        assert got_dict[key] == pytest.approx(value, rel=1e-12)


def test_khop_positives_symmetric_excludes_siblings():
    # 0 -> 1, 0 -> 2 (siblings 1, 2), 1 -> 3 (0 ~ 3 at 2 hops), 3 -> 4 (0 ~ 4 at 3 hops)
    adj = sp.csr_matrix(([2.0, 1.0, 0.5, 1.0], ([0, 0, 1, 3], [1, 2, 3, 4])), shape=(5, 5))
    pos = khop_positives(adj, 2).to_sparse().toarray()
    np.testing.assert_array_equal(pos, pos.T)
    assert pos[1, 2] == 0 and pos[0, 4] == 0  # siblings and 3-hop pairs are not positives
    assert pos[0, 1] == pytest.approx(1.0) and pos[0, 2] == pytest.approx(0.5)
    assert pos[0, 3] == pytest.approx(1.0 * 0.25)  # (2/2) * (0.5/2)
    assert pos[1, 4] == pytest.approx(0.25 * 0.5)
    assert khop_positives(adj, 3).to_sparse()[0, 4] == pytest.approx(0.125)
    assert np.all(np.diag(pos) == 0)


def test_strong_two_hop_path_beats_weak_direct_edge():
    adj = sp.csr_matrix(([0.1, 1.0, 1.0], ([0, 0, 1], [2, 1, 2])), shape=(3, 3))
    assert khop_positives(adj, 2).to_sparse()[0, 2] == pytest.approx(1.0)
    assert khop_positives(adj, 1).to_sparse()[0, 2] == pytest.approx(0.1)


def test_pagerank_generality_roots_high_and_matches_power_iteration():
    adj = random_dag(12, 0.3, seed=3)
    pi = pagerank_generality(adj, restart=0.15)
    assert pi.sum() == pytest.approx(1.0) and np.all(pi > 0)
    # Eq. 18 by power iteration: walk child -> parent with prob |A_ij| / in-degree(j); restart 0.15;
    # a node without parents (dangling in the reversed walk) restarts uniformly.
    a = np.abs(adj.toarray())
    n = a.shape[0]
    indeg = a.sum(0)
    trans = np.zeros((n, n))  # trans[j, i] = P(j -> i)
    for j in range(n):
        trans[j] = a[:, j] / indeg[j] if indeg[j] > 0 else 1.0 / n
    x = np.full(n, 1.0 / n)
    for _ in range(2000):
        x = 0.85 * x @ trans + 0.15 / n
    np.testing.assert_allclose(pi, x / x.sum(), rtol=1e-8)


def test_pagerank_chain_decreases_from_root():
    n = 6
    chain = sp.csr_matrix((np.ones(n - 1), (np.arange(n - 1), np.arange(1, n))), shape=(n, n))
    pi = pagerank_generality(chain)
    assert np.all(np.diff(pi) < 0)


@settings(max_examples=50, deadline=None)
@given(d=st.integers(2, 16), radius=st.floats(0.0, 7.0), seed=st.integers(0, 10_000))
def test_poincare_maps_are_mutual_inverses_and_preserve_distance(d, radius, seed):
    gen = torch.Generator().manual_seed(seed)
    direction = torch.randn(2, d, generator=gen, dtype=torch.float64)
    direction = direction / direction.norm(dim=-1, keepdim=True)
    radii = torch.tensor([radius, radius / 2], dtype=torch.float64)[:, None]
    p = torch.cat([torch.cosh(radii), torch.sinh(radii) * direction], dim=-1)
    e = lorentz_to_poincare(p)
    assert torch.all(e.norm(dim=-1) < 1)
    torch.testing.assert_close(poincare_to_lorentz(e), p, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(lorentz_to_poincare(poincare_to_lorentz(e)), e, rtol=1e-12, atol=1e-12)
    d_l = lorentz_distance(p[0], p[1])
    d_p = poincare_distance(e[0], e[1])
    assert float(d_l) == pytest.approx(float(d_p), rel=1e-6, abs=1e-6)


def test_poincare_maps_batch_shapes_and_geoopt_agreement():
    from geoopt.manifolds.lorentz import math as lmath

    gen = torch.Generator().manual_seed(0)
    spatial = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64)
    p = torch.cat([torch.sqrt(1 + (spatial**2).sum(-1, keepdim=True)), spatial], -1)
    e = lorentz_to_poincare(p)
    assert e.shape == (3, 4, 5)
    flat = lmath.lorentz_to_poincare(p.reshape(-1, 6), torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(e.reshape(-1, 5), flat)


def test_geometry_distances_agree_with_reference():
    gen = torch.Generator().manual_seed(1)
    spatial = torch.randn(7, 3, generator=gen, dtype=torch.float64)
    p = torch.cat([torch.sqrt(1 + (spatial**2).sum(-1, keepdim=True)), spatial], -1)
    mat = LorentzGeometry.dist_matrix(p, p)
    ref = lorentz_distance(p[:, None], p[None])
    off = ~torch.eye(7, dtype=torch.bool)
    torch.testing.assert_close(mat[off], ref[off])
    torch.testing.assert_close(LorentzGeometry.dist0(p), torch.acosh(p[:, 0]))
    torch.testing.assert_close(EuclideanGeometry.dist_matrix(spatial, spatial)[off],
                               torch.cdist(spatial, spatial)[off])


def test_distance_gradients_finite_at_coincident_points():
    x = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    for geom, pts in ((LorentzGeometry, x), (EuclideanGeometry, x[:, 1:])):
        loss = geom.dist_matrix(pts, pts).sum() + geom.dist0(pts).sum()
        (grad,) = torch.autograd.grad(loss, x)
        assert torch.isfinite(grad).all()


def exact_loss_by_definition(dist: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Eq. 16 written out with explicit loops."""
    n = dist.shape[0]
    out = np.zeros(n)
    for m in range(n):
        negatives = [j for j in range(n) if j != m and weights[m, j] == 0]
        neg_sum = sum(math.exp(-dist[m, j]) for j in negatives)
        for j in range(n):
            if weights[m, j] > 0:
                out[m] -= weights[m, j] * math.log(math.exp(-dist[m, j]) / (math.exp(-dist[m, j]) + neg_sum))
    return out


def test_exact_contrastive_loss_matches_definition():
    adj = random_dag(8, 0.3, seed=5)
    pairs = khop_positives(adj, 2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 3))
    dist = np.linalg.norm(x[:, None] - x[None], axis=-1)
    weights = pairs.to_sparse().toarray()
    dist_t = torch.tensor(dist)
    rows, cols = torch.tensor(pairs.rows), torch.tensor(pairs.cols)
    mask = torch.zeros(8, 8, dtype=torch.bool)
    mask[rows, cols] = True
    lse = negative_logsumexp_exact(dist_t, mask)
    got = contrastive_terms(dist_t[rows, cols], rows, torch.tensor(pairs.weights), lse, 8)
    np.testing.assert_allclose(got.numpy(), exact_loss_by_definition(dist, weights), rtol=1e-10)


def test_sampled_loss_equals_exact_when_samples_cover_every_negative():
    adj = random_dag(10, 0.3, seed=7)
    pairs = khop_positives(adj, 2)
    rng = np.random.default_rng(1)
    x = torch.tensor(rng.normal(size=(10, 2)))
    dist = EuclideanGeometry.dist_matrix(x, x)
    rows, cols = torch.tensor(pairs.rows), torch.tensor(pairs.cols)
    mask = torch.zeros(10, 10, dtype=torch.bool)
    mask[rows, cols] = True
    exact = negative_logsumexp_exact(dist, mask.clone())
    # "Samples" = every node once, repeated twice: valid ones are exactly the negatives.
    sample = torch.arange(10).repeat(10, 2)
    valid = ~mask.repeat(1, 2) & (sample != torch.arange(10)[:, None])
    n_neg = 9 - mask.sum(1)
    sampled = negative_logsumexp_sampled(dist.gather(1, sample), valid, n_neg)
    torch.testing.assert_close(sampled, exact)


def test_anchor_without_negatives_has_finite_loss_and_gradient():
    # A 3-node chain with k = 2: every other node is a positive of every node.
    adj = sp.csr_matrix(([1.0, 1.0], ([0, 1], [1, 2])), shape=(3, 3))
    pairs = khop_positives(adj, 2)
    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    dist = EuclideanGeometry.dist_matrix(x, x)
    rows, cols = torch.tensor(pairs.rows), torch.tensor(pairs.cols)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask.fill_diagonal_(False)
    lse = negative_logsumexp_exact(dist, mask)
    loss = contrastive_terms(dist[rows, cols], rows, torch.tensor(pairs.weights), lse, 3).sum()
    loss.backward()
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-12)  # log(e^-d / e^-d) = 0
    assert torch.isfinite(x.grad).all()


def test_check_dag_rejects_self_loop_and_names_cycle():
    names = ["GATA1", "SPI1", "CEBPA"]
    loop = sp.csr_matrix(([1.0], ([1], [1])), shape=(3, 3))
    with pytest.raises(CapeInputError, match="self-loop on gene SPI1"):
        check_dag(loop, names)
    cycle = sp.csr_matrix(([1.0, 1.0, 1.0], ([0, 1, 2], [1, 2, 0])), shape=(3, 3))
    with pytest.raises(CapeInputError, match="directed cycle: .*GATA1.*SPI1.*CEBPA") as err:
        check_dag(cycle, names)
    assert "\n" not in str(err.value)
    check_dag(sp.csr_matrix(([1.0], ([0], [1])), shape=(3, 3)), names)


def test_as_sparse_adjacency_rejects_non_square_and_nan():
    with pytest.raises(CapeInputError, match="square"):
        as_sparse_adjacency(np.zeros((3, 4)))
    with pytest.raises(CapeInputError, match="non-finite"):
        as_sparse_adjacency(np.array([[0.0, np.nan], [0.0, 0.0]]))
    with pytest.raises(CapeInputError, match="2-D"):
        as_sparse_adjacency(np.zeros(3))


def test_benchmark_relevance_equals_positive_set():
    from cape_benchmarks.embedding import khop_relevance

    for seed in range(5):
        adj = random_dag(15, 0.25, seed)
        for k in (1, 2, 3):
            pos = khop_positives(adj, k).to_sparse().toarray() > 0
            np.testing.assert_array_equal(khop_relevance(adj, k).toarray(), pos)
