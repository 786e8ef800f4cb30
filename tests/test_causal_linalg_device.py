"""Step I's covariance algebra on a torch device (the pipeline's CUDA runs) gives NumPy's answers."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from cape._arrays import add_to_diagonal, float64_on, to_numpy
from cape.causal import (
    CausalConfig,
    budget_tests,
    decoy_count,
    learn_causal_graph,
    partial_correlation_tests,
    partial_correlations,
    robust_partial_correlation_tests,
    shrunk_partial_correlations,
)
from cape.causal.pair_ranking import likelihood_shrinkage, shrunk_covariance
from cape.causal.postprocess import covariance

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])]


def _cells(n: int = 600, m: int = 12, seed: int = 0) -> np.ndarray:
    """A chain of genes in a mixture of cell types, counts-like (zeros), one gene barely detected, one constant."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, 3, n)
    X = rng.normal(size=(n, m)) * np.exp(rng.normal(0, 0.5, size=(3, m)))[group]
    for j in range(1, m // 2):
        X[:, j] += 0.8 * X[:, j - 1]
    X = np.log1p(np.clip(X + 1.0, 0, None))
    X[:, -2] = 0.0
    X[rng.choice(n, 4, replace=False), -2] = 1.5  # detected in four cells: the robust test leaves it out
    X[:, -1] = 0.7
    return X


@pytest.mark.parametrize("device", DEVICES)
def test_tests_and_partial_correlations_on_a_device_are_numpys(device: str) -> None:
    dev = torch.device(device)
    X = _cells()
    varying = X[:, :-1]
    np.testing.assert_allclose(to_numpy(covariance(sp.csr_matrix(X), dev)), np.cov(X, rowvar=False), atol=1e-12)
    np.testing.assert_allclose(partial_correlations(varying, dev), partial_correlations(varying), atol=1e-10)
    for test in (partial_correlation_tests, robust_partial_correlation_tests):
        here, there = test(sp.csr_matrix(varying)), test(varying, device=dev)
        np.testing.assert_array_equal(there[0], here[0])
        np.testing.assert_array_equal(np.isnan(there[1]), np.isnan(here[1]))
        # the robust test leaves the barely detected gene's pairs out, on either
        assert np.isnan(here[1]).any() == (test is robust_partial_correlation_tests)
        np.testing.assert_allclose(there[1], here[1], rtol=1e-8, atol=1e-300)
    np.testing.assert_allclose(budget_tests(varying, "both", device=dev)[1], budget_tests(varying, "both")[1],
                               rtol=1e-8)
    assert decoy_count(varying, 0.3, "fisher", seed=2, device=dev) == decoy_count(varying, 0.3, "fisher", seed=2)


@pytest.mark.parametrize("device", DEVICES)
def test_shrinkage_on_a_device_is_numpys(device: str) -> None:
    dev = torch.device(device)
    X = _cells(n=300, m=20, seed=1)
    Z = X[:, :-1]
    Z = (Z - Z.mean(0)) / Z.std(0)
    assert likelihood_shrinkage(Z, seed=3, device=dev) == likelihood_shrinkage(Z, seed=3)
    np.testing.assert_allclose(shrunk_partial_correlations(X, device=dev), shrunk_partial_correlations(X),
                               atol=1e-10)
    S = np.cov(Z, rowvar=False)
    np.testing.assert_allclose(to_numpy(shrunk_covariance(float64_on(S, dev), 0.3)), shrunk_covariance(S, 0.3),
                               atol=1e-14)


def test_diagonal_added_in_place_on_either_kind() -> None:
    a, t = np.zeros((3, 3)), torch.zeros(3, 3, dtype=torch.float64)
    add_to_diagonal(a, 2.0)
    add_to_diagonal(t, 2.0)
    np.testing.assert_array_equal(a, 2.0 * np.eye(3))
    np.testing.assert_array_equal(t.numpy(), a)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_pipeline_counts_the_cpus_budget() -> None:
    # The tests and the shrinkage run on the card: the budget's counts are the CPU's (the fits differ by rounding).
    X = _cells(n=900, m=14, seed=5)[:, :-2]
    genes = np.array([f"g{j}" for j in range(X.shape[1])])
    config = CausalConfig(epochs=3, min_positioned=0)
    cpu = learn_causal_graph(X, genes, config, device="cpu", seed=0).record["edge_budget"]
    cuda = learn_causal_graph(X, genes, config, device="cuda", seed=0).record["edge_budget"]
    for key in ("n_pairs_significant", "n_pairs_permuted", "n_pairs_tested"):
        assert cuda[key] == cpu[key]


def test_the_cpu_pipeline_keeps_numpys_algebra(monkeypatch) -> None:
    # On the CPU the tests and the shrinkage run as NumPy's routines: the results of every earlier release.
    from cape.causal import pipeline

    seen = []
    original = pipeline.partial_correlation_tests
    monkeypatch.setattr(pipeline, "partial_correlation_tests",
                        lambda X, device=None: seen.append(device) or original(X, device))
    X = _cells(n=300, m=8, seed=2)[:, :-2]
    learn_causal_graph(X, np.array([f"g{j}" for j in range(X.shape[1])]), CausalConfig(epochs=2, min_positioned=0),
                       device="cpu")
    assert seen == [None]
    # what the card must hold for it: four cells × genes and ten genes × genes float64 arrays
    assert pipeline.linalg_bytes(1000, 100) == 8 * (4 * 1000 * 100 + 10 * 100 * 100)
