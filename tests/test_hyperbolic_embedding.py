"""Step II embedding: stays on the hyperboloid, deterministic, recovers DAG structure, rejects bad input."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from cape import CapeInputError
from cape.hyperbolic import embed_dag, hyperboloid_residual, khop_positives
from cape_benchmarks.embedding import barabasi_albert_dag, embedding_fidelity


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


def test_empty_graph_with_origin_rule_puts_everything_at_origin_with_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="cape"):
        result = embed_dag(np.zeros((5, 5)), dim=3, epochs=10, isolated="origin", show_progress=False)
    assert "no edges" in caplog.text
    np.testing.assert_array_equal(result.points, np.tile([1.0, 0, 0, 0], (5, 1)))
    np.testing.assert_array_equal(result.poincare, 0.0)
    assert not result.embedded.any()
    assert result.fraction_at_origin() == 1.0
    np.testing.assert_allclose(result.generality, 0.2)


def test_empty_graph_spreads_every_gene_apart(caplog):
    with caplog.at_level(logging.WARNING, logger="cape"):
        result = embed_dag(np.zeros((6, 6)), dim=3, epochs=200, show_progress=False)
    assert "no edges" in caplog.text and "no causal information" in caplog.text
    assert_valid(result, 3)
    assert result.embedded.all() and not result.connected.any()
    assert result.fraction_at_origin() == 0.0
    dist = np.linalg.norm(result.poincare[:, None] - result.poincare[None], axis=-1)
    assert dist[~np.eye(6, dtype=bool)].min() > 0.05  # no two genes share a position


def test_disconnected_components_and_isolated_nodes():
    adj = sp.lil_matrix((8, 8))
    adj[0, 1] = adj[1, 2] = 1.0  # component A
    adj[3, 4] = adj[3, 5] = 1.0  # component B; nodes 6, 7 isolated
    result = embed_dag(adj.tocsr(), dim=2, epochs=200, show_progress=False)
    assert_valid(result, 2)
    assert result.embedded.all()
    np.testing.assert_array_equal(result.connected, [True] * 6 + [False] * 2)
    norms = np.linalg.norm(result.poincare, axis=1)
    assert norms[6:].min() > 1e-3
    assert np.linalg.norm(result.poincare[6] - result.poincare[7]) > 1e-2
    origin_rule = embed_dag(adj.tocsr(), dim=2, epochs=200, isolated="origin", show_progress=False)
    np.testing.assert_array_equal(origin_rule.embedded, [True] * 6 + [False] * 2)
    np.testing.assert_array_equal(origin_rule.poincare[6:], 0.0)


def test_nodes_mask_keeps_other_genes_at_origin_but_never_drops_connected_ones():
    adj = sp.lil_matrix((6, 6))
    adj[0, 1] = 1.0
    mask = np.array([False, False, True, True, False, False])  # node 1 has an edge: it takes part anyway
    result = embed_dag(adj.tocsr(), dim=2, epochs=50, nodes=mask, show_progress=False)
    np.testing.assert_array_equal(result.embedded, [True, True, True, True, False, False])
    np.testing.assert_array_equal(result.poincare[4:], 0.0)
    assert result.fraction_at_origin(mask) == 0.0
    with pytest.raises(CapeInputError, match="nodes must be a bool mask"):
        embed_dag(adj.tocsr(), dim=2, epochs=1, nodes=mask[:3], show_progress=False)
    with pytest.raises(CapeInputError, match="isolated"):
        embed_dag(adj.tocsr(), dim=2, epochs=1, isolated="drop", show_progress=False)


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


def test_fused_lorentz_negative_term_matches_autograd_reference():
    from cape.hyperbolic.geometry import LorentzGeometry
    from cape.hyperbolic.loss import lorentz_sampled_negative_logsumexp, negative_logsumexp_sampled
    from cape.hyperbolic.poincare import lift_to_hyperboloid

    gen = torch.Generator().manual_seed(0)
    x = lift_to_hyperboloid(torch.randn(9, 4, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    y = lift_to_hyperboloid(torch.randn(6, 4, generator=gen, dtype=torch.float64) * 2)
    y = torch.cat([y, x[:1].detach()]).requires_grad_()  # a sample that coincides with anchor 0 (u at its floor)
    valid = torch.rand(9, 7, generator=gen) > 0.3
    valid[2] = False  # an anchor without any valid sample
    n_neg = torch.tensor([4, 6, 3, 0, 5, 2, 8, 1, 7])  # anchor 3 has no negatives at all
    weights = torch.randn(9, generator=gen, dtype=torch.float64)
    for tau in (1.0, 0.5, 0.1):
        fused = lorentz_sampled_negative_logsumexp(x, y, valid, n_neg, tau)
        ref = negative_logsumexp_sampled(LorentzGeometry.dist_matrix(x, y) / tau, valid, n_neg)
        torch.testing.assert_close(fused, ref, rtol=1e-12, atol=0.0)
        assert float(fused[2].detach()) == float(fused[3].detach()) == -1e30
        g_fused = torch.autograd.grad((fused * weights).sum(), (x, y))
        g_ref = torch.autograd.grad((ref * weights).sum(), (x, y))
        for a, b in zip(g_fused, g_ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # finite differences away from the coincident pair (the distance has a kink at 0)
    y_apart = y[:-1].detach().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, b: lorentz_sampled_negative_logsumexp(a, b, valid[:, :-1], n_neg, 0.5), (x, y_apart))


def test_valid_negatives_match_brute_force():
    from cape.hyperbolic.embedding import _valid_negatives
    from cape.hyperbolic.positives import khop_positives

    adj = barabasi_albert_dag(40, 2, seed=3)
    pairs = khop_positives(adj, 2)
    positive = pairs.to_sparse().toarray() > 0
    rows, cols = torch.as_tensor(pairs.rows), torch.as_tensor(pairs.cols)
    slot = torch.full((40,), -1, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    for k in (1, 7, 40):
        sample = torch.randperm(40, generator=gen)[:k]
        valid = _valid_negatives(sample, slot, torch.arange(k), rows, cols, 40)
        expected = ~positive[:, sample.numpy()] & (sample.numpy()[None, :] != np.arange(40)[:, None])
        np.testing.assert_array_equal(valid.numpy(), expected)
        assert torch.all(slot == -1)  # scratch buffer restored


@pytest.mark.parametrize("geometry", ["hyperbolic", "euclidean"])
def test_sampling_every_node_reproduces_the_exact_loss(geometry):
    # K ≥ M draws every node each epoch: the estimate is the exact negative sum, so the runs coincide.
    adj = barabasi_albert_dag(30, 2, seed=5)
    exact = embed_dag(adj, dim=4, epochs=60, negatives=None, geometry=geometry, show_progress=False)
    sampled = embed_dag(adj, dim=4, epochs=60, negatives=64, geometry=geometry, show_progress=False)
    np.testing.assert_allclose(sampled.losses, exact.losses, rtol=1e-9)
    np.testing.assert_allclose(sampled.points, exact.points, rtol=1e-7, atol=1e-9)


def test_temperature_divides_the_contrastive_distances():
    # With λ_g = 0 and τ, the first loss equals the paper's contrastive loss of the distances / τ.
    from cape.hyperbolic.geometry import LorentzGeometry
    from cape.hyperbolic.loss import contrastive_terms, negative_logsumexp_exact
    from cape.hyperbolic.poincare import lift_to_hyperboloid
    from cape.hyperbolic.positives import khop_positives

    adj = barabasi_albert_dag(12, 2, seed=0)
    pairs = khop_positives(adj, 2)
    rows, cols = torch.as_tensor(pairs.rows), torch.as_tensor(pairs.cols)
    mask = torch.zeros(12, 12, dtype=torch.bool)
    mask[rows, cols] = True
    for tau in (1.0, 0.5):
        result = embed_dag(adj, dim=3, epochs=1, lambda_g=0.0, temperature=tau, init_scale=0.5, seed=2,
                           show_progress=False)
        spatial = torch.randn(12, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 0.5
        dist = LorentzGeometry.dist_matrix(lift_to_hyperboloid(spatial), lift_to_hyperboloid(spatial)) / tau
        expected = contrastive_terms(dist[rows, cols], rows, torch.as_tensor(pairs.weights),
                                     negative_logsumexp_exact(dist, mask.clone()), 12).mean()
        assert result.losses[0] == pytest.approx(float(expected), rel=1e-10)
        assert result.params["temperature"] == tau
    for bad in (0.0, -1.0, float("nan"), "hot"):
        with pytest.raises(CapeInputError, match="temperature"):
            embed_dag(adj, epochs=1, temperature=bad, show_progress=False)


def _map_above_oracle(seed: int) -> dict:
    adj = barabasi_albert_dag(100, 2, seed=seed)
    result = embed_dag(adj, dim=8, seed=seed, negatives=None, show_progress=False)
    return embedding_fidelity(result.points, result.poincare, adj, result.generality, tie_draws=10)


def test_ba_dag_map_beats_graph_distance_oracle_with_defaults():
    # Issue 4 target on the seed with the smallest margin (seed 4: oracle ≈ 0.78); all seeds 0–4 in the slow test.
    fid = _map_above_oracle(4)
    assert fid["map"] >= fid["oracle_map"]
    assert fid["spearman"] >= 0.6


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_ba_dag_map_beats_graph_distance_oracle_every_seed(seed):
    fid = _map_above_oracle(seed)
    assert fid["map"] >= fid["oracle_map"]
    assert fid["spearman"] >= 0.6


@pytest.mark.slow  # an end-to-end benchmark run (records, table, plot): `pytest -m slow`
def test_scaling_benchmark_writes_records_table_and_plot(tmp_path):
    import json

    from cape_benchmarks.embedding import run_benchmark

    records = run_benchmark(tmp_path, quick=True, sections=("scaling",))
    saved = json.loads((tmp_path / "embedding_scaling.json").read_text())
    assert len(saved) == len(records) > 0
    parts = {r["part"] for r in saved}
    assert {"time vs M", "exact vs sampled"} <= parts and len(parts) == 3
    timed = {(r["loss"], r["n_genes"]) for r in saved if r["part"] == "time vs M"}
    assert ("exact", 100) in timed and ("sampled K=64", 300) in timed
    assert "exact vs sampled" in (tmp_path / "embedding_scaling.md").read_text()
    assert (tmp_path / "embedding_scaling.png").stat().st_size > 0


def test_per_anchor_weights_bring_a_hub_inside_its_genes_with_an_edge():
    # a hub driving 10 genes, ten pairs and 90 genes without an edge: with Eq. 16's weights the hub's 10 negative
    # terms push it outward; divided by each anchor's sum they push it as hard as any other gene's
    n = 120
    dag = sp.lil_matrix((n, n))
    dag[0, 1:11] = 1.0
    for a in range(11, 31, 2):
        dag[a, a + 1] = 1.0
    ranks = {}
    for weights in ("path", "per_anchor"):
        result = embed_dag(dag.tocsr(), epochs=300, positive_weights=weights, show_progress=False)
        assert np.argmax(result.generality) == 0
        norms = np.linalg.norm(result.poincare, axis=1)
        ranks[weights] = int((norms[1:31] < norms[0]).sum())  # genes with an edge nearer the origin than the hub
        assert result.params["positive_weight"].endswith("/anchor_sum") == (weights == "per_anchor")
    assert ranks["per_anchor"] == 0 and ranks["path"] >= 10


def test_per_anchor_weights_sum_to_one_per_anchor():
    pairs = khop_positives(sp.csr_matrix(np.triu(np.full((4, 4), 0.5), 1)), 2).per_anchor()
    np.testing.assert_allclose(np.bincount(pairs.rows, weights=pairs.weights), 1.0)
