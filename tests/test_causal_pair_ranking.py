"""cape.causal.pair_ranking: which gene pairs the edge budget keeps (the fit and the partial correlations together,
the fit alone, or the shrunk partial correlations)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.covariance import ledoit_wolf

from cape import CapeInputError
from cape.causal import (
    CausalConfig,
    consensus_scores,
    is_dag,
    learn_causal_graph,
    make_dag,
    pair_ranking_for,
    partial_correlations,
    ranked_pairs,
    shrunk_partial_correlations,
    top_pairs_oriented,
)
from cape.causal.pair_ranking import SHRINKAGE_GRID, _fold_spectra, likelihood_shrinkage
from cape.causal.pipeline import budget_dag, threshold
from cape.causal.postprocess import AUTO_TAU_FLOOR, tau_for_edges


def _problem(m: int, seed: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    A = rng.uniform(-1, 1, size=(m, m)) * (rng.random((m, m)) < 0.5)
    np.fill_diagonal(A, 0.0)
    pairs = np.triu_indices(m, 1)
    return A, pairs, rng.random(pairs[0].size)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(2, 12), seed=st.integers(0, 10_000))
def test_scores_are_mean_normalised_ranks_and_ignore_monotone_transforms(m: int, seed: int) -> None:
    A, pairs, p = _problem(m, seed)
    scores = consensus_scores(A, pairs, p)
    assert scores.shape == p.shape and np.all(scores > 0) and np.all(scores <= 1)
    # only the two orders count: cubing the weights and squaring the p-values changes nothing
    np.testing.assert_allclose(consensus_scores(A**3, pairs, p**2), scores)
    # a pair first by both rankings scores 1
    best = np.argmin(p)
    A2 = A.copy()
    A2[pairs[0][best], pairs[1][best]] = 10.0
    assert consensus_scores(A2, pairs, p)[best] == pytest.approx(1.0)


def test_a_pair_counts_by_both_rankings() -> None:
    # pair (0, 1): heaviest in the fit, not significant; pair (2, 3): most significant, light in the fit;
    # pair (0, 2): second by both, so it is kept first
    A = np.zeros((4, 4))
    A[0, 1], A[0, 2], A[2, 3], A[1, 3] = 0.9, 0.5, 0.015, 0.02
    pairs = np.triu_indices(4, 1)  # (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
    p = np.array([0.9, 1e-6, 0.5, 0.4, 0.3, 1e-9])
    scores = consensus_scores(A, pairs, p)
    assert np.argmax(scores) == 1
    chosen = top_pairs_oriented(A, pairs, scores, 1, AUTO_TAU_FLOOR)
    assert np.flatnonzero(chosen).tolist() == [2]  # 0 → 2 alone
    # the fit's ranking alone keeps (0, 1) first; the test's alone (2, 3)
    assert np.argmax(np.abs(A)) == 1 and np.argmin(p) == 5


def test_kept_pairs_point_the_fits_way_with_its_weight_and_unweighted_pairs_give_way() -> None:
    A = np.zeros((3, 3))
    A[1, 0], A[0, 1] = -0.4, 0.1  # the fit prefers 1 → 0
    A[1, 2] = 0.005  # below the noise floor
    A[2, 0] = 0.3
    pairs = np.triu_indices(3, 1)
    scores = np.array([0.9, 0.1, 0.8])  # (0,1) (0,2) (1,2)
    chosen = top_pairs_oriented(A, pairs, scores, 2, AUTO_TAU_FLOOR)
    # (1, 2) has no weight above the floor: the next pair, (0, 2), takes its place, as 2 → 0
    assert chosen[1, 0] == -0.4 and chosen[2, 0] == 0.3 and np.count_nonzero(chosen) == 2
    assert np.count_nonzero(top_pairs_oriented(A, pairs, scores, 1, AUTO_TAU_FLOOR)) == 1
    assert np.count_nonzero(top_pairs_oriented(A, pairs, scores, 3, AUTO_TAU_FLOOR)) == 2  # only two are weighted
    assert np.count_nonzero(top_pairs_oriented(A, pairs, scores, 0, AUTO_TAU_FLOOR)) == 0


@settings(max_examples=25, deadline=None)
@given(m=st.integers(3, 12), seed=st.integers(0, 10_000), k=st.integers(0, 40))
def test_the_budget_graph_is_a_dag_of_at_most_k_pairs_ranked_by_both(m: int, seed: int, k: int) -> None:
    A, pairs, p = _problem(m, seed)
    graph = threshold(A, CausalConfig(min_positioned=0), k, 500, (pairs, consensus_scores(A, pairs, p)))
    assert is_dag(graph.dag)
    kept = np.triu((graph.dag != 0) | (graph.dag != 0).T, 1)
    assert kept.sum() <= k
    scores = graph.pair_scores[pairs]
    weighted = np.maximum(np.abs(A[pairs]), np.abs(A.T[pairs])) > AUTO_TAU_FLOOR
    if kept.sum():  # every kept pair scores at least as high as the k-th best pair the fit weights
        eligible = np.sort(scores[weighted])[::-1]
        assert scores[kept[pairs]].min() >= eligible[min(k, eligible.size) - 1]
    assert np.all(np.abs(graph.dag[graph.dag != 0]) > AUTO_TAU_FLOOR)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(m=st.integers(3, 12), seed=st.integers(0, 10_000), k=st.integers(0, 40))
def test_the_budget_keeps_only_pairs_its_test_judged(m: int, seed: int, k: int) -> None:
    """Pairs the budget's test could not judge (a gene detected in a handful of cells) are never kept; the same
    graph as ranking the judged pairs alone, and every pair's score is still in the score matrix."""
    A, pairs, p = _problem(m, seed)
    scores = consensus_scores(A, pairs, p)
    judged = np.random.default_rng(seed).random(scores.size) < 0.6
    graph = threshold(A, CausalConfig(min_positioned=0), k, 500, (pairs, scores), judged)
    kept = np.triu((graph.dag != 0) | (graph.dag != 0).T, 1)[pairs]
    assert not (kept & ~judged).any()
    alone = ((pairs[0][judged], pairs[1][judged]), scores[judged])
    np.testing.assert_array_equal(graph.dag, threshold(A, CausalConfig(min_positioned=0), k, 500, alone).dag)
    np.testing.assert_allclose(graph.pair_scores[pairs], scores)
    with pytest.raises(ValueError, match="judged flags"):
        threshold(A, CausalConfig(min_positioned=0), k, 500, (pairs, scores), judged[:-1])


def test_pair_ranking_fit_is_the_k_heaviest_weights() -> None:
    A, pairs, p = _problem(10, 3)
    # a ranking handed in is ignored: "fit" ranks by A alone
    graph = threshold(A, CausalConfig(pair_ranking="fit", min_positioned=0), 12, 500, (pairs, p))
    np.testing.assert_array_equal(graph.dag, make_dag(A, tau_for_edges(A, 12))[0])
    assert graph.pair_scores is None  # A itself ranked the pairs


def test_auto_ranks_by_consensus_only_where_cells_are_labelled_intervened() -> None:
    mask = np.zeros((6, 3), dtype=bool)
    assert pair_ranking_for("auto") == "shrunk_partial_correlation"
    assert pair_ranking_for("auto", mask) == "shrunk_partial_correlation"  # labels given, every cell a control
    mask[2, 1] = True
    assert pair_ranking_for("auto", mask) == pair_ranking_for("auto", sp.csr_matrix(mask)) == "consensus"
    for ranking in ("consensus", "fit", "shrunk_partial_correlation"):  # an explicit ranking stands for itself
        assert pair_ranking_for(ranking) == pair_ranking_for(ranking, mask) == ranking
    with pytest.raises(ValueError, match="unknown pair ranking"):
        pair_ranking_for("borda")
    with pytest.raises(ValueError, match="unresolved"):
        ranked_pairs("auto", np.zeros((3, 3)), (np.triu_indices(3, 1), np.ones(3)), np.zeros((5, 3)))


def test_the_pipeline_ranks_by_consensus_and_records_it() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 8))
    X[:, 1] += X[:, 0]
    X[:, 2] += 0.8 * X[:, 1]
    X[:, 5] += 0.7 * X[:, 4]
    genes = np.array([f"g{i}" for i in range(8)])
    options = {"epochs": 5, "batch_size": 64, "edge_confidence": False, "min_positioned": 0}
    graph = learn_causal_graph(X.astype(np.float32), genes, CausalConfig(pair_ranking="consensus", **options),
                               device="cpu", seed=0)
    fit_only = learn_causal_graph(X.astype(np.float32), genes, CausalConfig(pair_ranking="fit", **options),
                                  device="cpu", seed=0)
    shrunk_config = CausalConfig(pair_ranking="shrunk_partial_correlation", **options)
    shrunk = learn_causal_graph(X.astype(np.float32), genes, shrunk_config, device="cpu", seed=0)
    assert graph.record["edge_budget"]["pair_ranking"] == "consensus"
    assert fit_only.record["edge_budget"]["pair_ranking"] == "fit"
    assert shrunk.record["edge_budget"]["pair_ranking"] == "shrunk_partial_correlation"
    np.testing.assert_array_equal(graph.fit.adjacency, fit_only.fit.adjacency)  # the ranking acts after the fit
    np.testing.assert_array_equal(graph.fit.adjacency, shrunk.fit.adjacency)
    for g in (graph, shrunk):
        skeleton = np.triu((g.dag != 0) | (g.dag != 0).T, 1)
        assert skeleton[0, 1] and skeleton[1, 2] and skeleton[4, 5]
    # the shrunk ranking's scores are the shrunk partial correlations' sizes
    np.testing.assert_allclose(shrunk.pair_scores, np.abs(shrunk_partial_correlations(X.astype(np.float32))), atol=1e-9)
    with pytest.raises(CapeInputError, match="pair_ranking must be one of auto, consensus, fit, shrunk_partial"):
        CausalConfig(pair_ranking="borda")
    # the default resolves by the labels: shrunk on observational cells, consensus once some cell is intervened on
    default = learn_causal_graph(X.astype(np.float32), genes, CausalConfig(**options), device="cpu", seed=0)
    assert default.record["edge_budget"]["pair_ranking"] == "shrunk_partial_correlation"
    np.testing.assert_array_equal(default.dag, shrunk.dag)
    intervened = np.zeros(X.shape, dtype=bool)
    intervened[:40, 3] = True
    labelled = learn_causal_graph(X.astype(np.float32), genes, CausalConfig(**options), intervened=intervened,
                                  device="cpu", seed=0)
    assert labelled.record["edge_budget"]["pair_ranking"] == "consensus"


@settings(max_examples=20, deadline=None)
@given(n=st.integers(3, 60), m=st.integers(2, 10), seed=st.integers(0, 10_000))
def test_shrunk_partial_correlations_are_correlations_blind_to_each_genes_scale(n: int, m: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, m)) @ rng.normal(size=(m, m))  # correlated genes, also fewer cells than genes
    R = shrunk_partial_correlations(X)
    assert R.shape == (m, m) and np.all(np.isfinite(R))
    np.testing.assert_allclose(R, R.T, atol=1e-12)
    assert np.all(np.diag(R) == 0) and np.all(np.abs(R) <= 1 + 1e-12)
    # each gene standardised first: shifting and rescaling a gene changes nothing, a sign flip flips its row
    scale = rng.uniform(0.1, 10, size=m) * np.where(rng.random(m) < 0.3, -1, 1)
    R2 = shrunk_partial_correlations(X * scale + rng.normal(size=m))
    np.testing.assert_allclose(R2, R * np.outer(np.sign(scale), np.sign(scale)), atol=1e-8)


def test_shrunk_partial_correlations_tend_to_the_partial_correlations_with_many_cells() -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50_000, 5))
    X[:, 1] += X[:, 0]
    X[:, 2] += X[:, 1] - X[:, 3]
    np.testing.assert_allclose(shrunk_partial_correlations(X), partial_correlations(X), atol=0.01)
    # a constant gene has no partial correlation with any other
    X[:, 4] = 3.0
    R = shrunk_partial_correlations(X)
    assert np.all(R[4] == 0) and np.all(R[:, 4] == 0) and np.all(np.isfinite(R))


def test_shrinkage_zero_is_the_partial_correlations_and_bad_intensities_are_refused() -> None:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(400, 6)) @ rng.normal(size=(6, 6))
    np.testing.assert_allclose(shrunk_partial_correlations(X, shrinkage=0.0), partial_correlations(X), atol=1e-6)
    # full shrinkage's limit: the partial correlations fade towards 0 as s grows
    assert np.abs(shrunk_partial_correlations(X, shrinkage=0.9)).max() < np.abs(partial_correlations(X)).max()
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="shrinkage must be in"):
            shrunk_partial_correlations(X, shrinkage=bad)


def test_likelihood_shrinkage_follows_what_held_out_cells_support() -> None:
    rng = np.random.default_rng(4)
    # independent genes, few cells for their number: the sample correlations are noise, shrink hard
    assert likelihood_shrinkage(rng.normal(size=(60, 30))) == max(SHRINKAGE_GRID)
    # a strong chain on many cells: the sample correlations hold, shrink little
    X = rng.normal(size=(20_000, 4))
    X[:, 1] += 2 * X[:, 0]
    X[:, 2] += 2 * X[:, 1]
    Z = (X - X.mean(0)) / X.std(0)
    assert likelihood_shrinkage(Z) <= 0.01
    # seeded folds; with fewer than two cells per fold, Ledoit-Wolf's intensity
    assert likelihood_shrinkage(Z[:500], seed=1) == likelihood_shrinkage(Z[:500], seed=1)
    assert likelihood_shrinkage(Z[:7]) == pytest.approx(ledoit_wolf(Z[:7])[1])


def _per_eigenspace(eigenvalues: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """The spread summed over each eigenspace: with fewer training cells than genes the zero eigenvalue repeats and
    any basis of its space is right; the likelihood reads only these sums."""
    return np.bincount(np.concatenate([[0], np.cumsum(np.diff(eigenvalues) > 1e-8)]), spread)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(6, 80), m=st.integers(1, 12), folds=st.integers(2, 4), seed=st.integers(0, 10_000))
def test_each_folds_spectrum_is_that_of_its_training_cells_seen_by_its_held_out_cells(n: int, m: int, folds: int,
                                                                                      seed: int) -> None:
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, m)) @ rng.normal(size=(m, m)) + rng.normal(size=m)
    parts = np.array_split(rng.permutation(n), folds)
    spectra = list(_fold_spectra(Z, parts, np))
    assert len(spectra) == folds
    for part, (eigenvalues, spread) in zip(parts, spectra, strict=True):
        train, test = np.delete(Z, part, axis=0), Z[part]
        expected, vectors = np.linalg.eigh(np.cov(train, rowvar=False, ddof=0).reshape(m, m))
        np.testing.assert_allclose(eigenvalues, expected, atol=1e-9)
        # the held-out cells' second moments about the training centre along each eigenvector
        held_out = ((test - train.mean(axis=0)) @ vectors) ** 2
        np.testing.assert_allclose(_per_eigenspace(expected, spread), _per_eigenspace(expected, held_out.mean(0)),
                                   atol=1e-9)
    # the torch path (the pipeline's CUDA runs) gives the same numbers
    for (e, s), (te, ts) in zip(spectra, _fold_spectra(torch.from_numpy(Z), parts, torch), strict=True):
        np.testing.assert_allclose(te, e, atol=1e-9)
        np.testing.assert_allclose(_per_eigenspace(e, ts), _per_eigenspace(e, s), atol=1e-9)


def test_ranked_pairs_per_ranking() -> None:
    rng = np.random.default_rng(2)
    X = rng.normal(size=(200, 6))
    A, pairs, p = _problem(6, 4)
    assert ranked_pairs("fit", A, (pairs, p), X) is None
    assert ranked_pairs("consensus", A, None, X) is None  # no tests, no budget: the fit decides
    consensus = ranked_pairs("consensus", A, (pairs, p), X)
    np.testing.assert_array_equal(consensus[1], consensus_scores(A, pairs, p))
    shrunk = ranked_pairs("shrunk_partial_correlation", A, (pairs, p), X)
    np.testing.assert_allclose(shrunk[1], np.abs(shrunk_partial_correlations(X)[pairs]))
    with pytest.raises(ValueError, match="unknown or unresolved pair ranking 'borda'"):
        ranked_pairs("borda", A, (pairs, p), X)


def test_pairs_that_cycles_cost_are_the_rankings_weakest_not_the_fits_lightest() -> None:
    """Four pairs in the budget; the fit's directions close 0 → 1 → 2 → 0. Breaking that cycle leaves three pairs, and
    the ranking, not the fit's weights, says which three: its best, the cycle-closing edge turned round."""
    A = np.zeros((4, 4))
    A[0, 1], A[1, 2], A[2, 0], A[0, 2], A[2, 3] = 0.5, 0.5, 0.4, 0.2, 0.6
    pairs = (np.array([0, 1, 0, 2]), np.array([1, 2, 2, 3]))
    scores = np.array([0.9, 0.8, 0.7, 0.1])  # the pair 2 – 3 ranks last
    dag, removed, turned, _ = budget_dag(A, 4, (pairs, scores))
    assert (removed, turned) == (1, 1)
    expected = np.zeros((4, 4))
    expected[0, 1], expected[1, 2], expected[0, 2] = 0.5, 0.5, 0.2
    np.testing.assert_array_equal(dag, expected)
    graph = threshold(A, CausalConfig(min_positioned=0), 4, 500, (pairs, scores))
    np.testing.assert_array_equal(graph.dag, expected)
    assert (graph.removed, graph.turned) == (1, 1)
    # Without a cycle the budget's pairs are kept as the fit points them.
    A[2, 0], A[0, 2] = 0.2, 0.4
    dag, removed, turned, _ = budget_dag(A, 4, (pairs, scores))
    assert (removed, turned) == (0, 0) and np.count_nonzero(dag) == 4
