"""The budget's partial-correlation tests: Fisher's z and the heteroscedasticity-robust (sandwich) test."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

import cape.causal.postprocess as postprocess
from cape import CapeInputError
from cape.causal import (
    CausalConfig,
    budget_tests,
    edge_budget,
    partial_correlation_tests,
    partial_correlations,
    robust_partial_correlation_tests,
)
from cape.causal.postprocess import BUDGET_TEST, _bh_count


def _heteroscedastic_null(n: int, m: int, seed: int) -> np.ndarray:
    """Independent genes whose spread changes with a hidden cell type (genes switched on and off)."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, 5, n)
    scale = np.exp(rng.normal(0.0, 1.2, size=(5, m)))
    return rng.normal(size=(n, m)) * scale[group]


def test_robust_test_is_calibrated_on_gaussian_data_like_fishers() -> None:
    X = np.random.default_rng(0).normal(size=(1500, 120))
    _, p_robust = robust_partial_correlation_tests(X)
    _, p_fisher = partial_correlation_tests(X)
    assert 0.04 <= np.mean(p_robust < 0.05) <= 0.06 and 0.04 <= np.mean(p_fisher < 0.05) <= 0.06
    # the same statistic to first order on homoscedastic data
    assert np.corrcoef(np.log(p_robust), np.log(p_fisher))[0, 1] > 0.9
    for test in ("fisher", "robust", "both"):  # BH on null pairs: rarely any
        assert edge_budget(X, 0.3, test=test) <= 3 and edge_budget(X, 0.05, test=test) <= 1


def test_robust_test_holds_its_rate_where_fishers_z_does_not() -> None:
    X = _heteroscedastic_null(1500, 150, seed=1)
    p_fisher = partial_correlation_tests(X)[1]
    p_robust = robust_partial_correlation_tests(X)[1]
    assert np.mean(p_fisher < 0.05) > 0.055      # too many small p-values: every pair is null here
    assert 0.04 <= np.mean(p_robust < 0.05) <= 0.055
    assert edge_budget(X, 0.3, test="fisher") > 50
    assert edge_budget(X, 0.3, test="robust") <= 2 and edge_budget(X, 0.3, test="both") <= 2


def test_both_counts_a_pair_only_where_both_tests_call_it() -> None:
    X = _heteroscedastic_null(800, 30, seed=7)
    X[:, 1] += X[:, 0] / X[:, 0].std() * X[:, 1].std()            # one real pair
    X[:, 2] = 0.0
    X[np.arange(5), 2] = 1.0                                          # a gene detected in 5 cells: not tested robustly
    _, fisher = budget_tests(X, "fisher")
    _, robust = budget_tests(X, "robust")
    _, both = budget_tests(X, "both")
    tested = np.isfinite(robust)
    np.testing.assert_array_equal(both[tested], np.maximum(fisher, robust)[tested])
    # Fisher's tests made earlier (the screen's) are taken as they are, not made again
    given = (budget_tests(X, "fisher")[0], np.full_like(fisher, 0.5))
    assert budget_tests(X, "fisher", fisher=given) is given
    np.testing.assert_array_equal(budget_tests(X, "both", fisher=given)[1][tested], np.maximum(0.5, robust)[tested])
    assert np.isnan(both[~tested]).all() and (~tested).sum() == 29   # the 29 pairs of gene 2
    for fdr in (0.05, 0.3):
        assert edge_budget(X, fdr, test="both") <= min(edge_budget(X, fdr), edge_budget(X, fdr, test="robust"))
    assert edge_budget(X, 0.05, test="both") >= 1


def test_robust_test_finds_a_real_partial_correlation() -> None:
    X = _heteroscedastic_null(1000, 20, seed=2)
    X[:, 1] += 0.3 * X[:, 0] / X[:, 0].std() * X[:, 1].std()
    (rows, cols), p = robust_partial_correlation_tests(X)
    pair = np.flatnonzero((rows == 0) & (cols == 1))[0]
    assert p[pair] < 1e-6 and edge_budget(X, 0.05, test="robust") >= 1


def test_robust_test_is_unchanged_by_gene_scale_and_order() -> None:
    rng = np.random.default_rng(3)
    X = _heteroscedastic_null(400, 12, seed=3)
    (rows, cols), p = robust_partial_correlation_tests(X)
    rescaled = X * rng.uniform(0.1, 10.0, size=12) + rng.normal(size=12)
    np.testing.assert_allclose(robust_partial_correlation_tests(rescaled)[1], p, rtol=1e-4)  # the ridge of 1e-8
    order = rng.permutation(12)
    (r2, c2), p2 = robust_partial_correlation_tests(X[:, order])
    P, P2 = np.zeros((12, 12)), np.zeros((12, 12))
    P[rows, cols] = p
    P2[order[r2], order[c2]] = p2
    np.testing.assert_allclose(P + P.T, P2 + P2.T, rtol=1e-6)


def test_robust_statistic_is_the_residual_correlation_studentised(monkeypatch) -> None:
    """Brute force: each gene regressed on all the others by least squares; cells in blocks give the same p."""
    X = _heteroscedastic_null(300, 6, seed=4)
    n, m = X.shape
    centred = X - X.mean(0)
    residuals = np.empty_like(centred)
    for i in range(m):
        others = np.delete(centred, i, axis=1)
        residuals[:, i] = centred[:, i] - others @ np.linalg.lstsq(others, centred[:, i], rcond=None)[0]
    (rows, cols), p = robust_partial_correlation_tests(X)
    e_i, e_j = residuals[:, rows], residuals[:, cols]
    z = (e_i * e_j).sum(0) / np.sqrt((e_i ** 2 * e_j ** 2).sum(0)) * np.sqrt((n - m - 1) / n)
    np.testing.assert_allclose(p, 2 * norm.sf(np.abs(z)), rtol=1e-6)
    # the residuals' correlation is the partial correlation, up to sign
    R = partial_correlations(X)
    np.testing.assert_allclose(np.abs([np.corrcoef(a, b)[0, 1] for a, b in zip(e_i.T, e_j.T, strict=True)]),
                               np.abs(R[rows, cols]), rtol=1e-6)
    monkeypatch.setattr(postprocess, "_ROBUST_BLOCK_CELLS", 7)
    np.testing.assert_allclose(robust_partial_correlation_tests(X)[1], p, rtol=1e-9)


def test_barely_detected_genes_are_not_tested() -> None:
    rng = np.random.default_rng(5)
    X = np.log1p(rng.poisson(3.0, size=(500, 8)).astype(float))
    X[:, 0] = 0.0
    X[rng.choice(500, 9, replace=False), 0] = 1.0  # detected in 9 cells: below the 10 the test needs
    (rows, cols), p = robust_partial_correlation_tests(X)
    touches = (rows == 0) | (cols == 0)
    assert np.isnan(p[touches]).all() and np.isfinite(p[~touches]).all()
    assert np.isfinite(robust_partial_correlation_tests(X, min_detected=9)[1]).all()
    # the rule reads where the variance lies, not which values are zero: shifted or centred within groups, the same
    groups = np.arange(500) % 3
    centred = X - np.stack([X[groups == k].mean(0) for k in range(3)])[groups]
    assert np.isnan(robust_partial_correlation_tests(centred)[1][touches]).all()
    assert np.isnan(robust_partial_correlation_tests(X * 3.0 - 7.0)[1][touches]).all()
    # untested pairs are not hypotheses: the count is that of the tested pairs alone
    assert _bh_count(p, 0.3) == _bh_count(p[~touches], 0.3)


def test_too_few_cells_and_unknown_test() -> None:
    X = np.random.default_rng(6).normal(size=(15, 10))
    assert robust_partial_correlation_tests(X) is None and edge_budget(X, test="both") is None
    with pytest.raises(ValueError, match="test must be one of both, robust, fisher"):
        edge_budget(np.random.default_rng(6).normal(size=(100, 3)), test="spearman")
    with pytest.raises(CapeInputError, match="budget_test must be one of both, robust, fisher, state, got 'spearman'"):
        CausalConfig(budget_test="spearman")
    assert CausalConfig().budget_test == "both" == BUDGET_TEST


def _mean_shift_null(n: int, m: int, seed: int) -> np.ndarray:
    """Independent genes within each of 4 cell types whose means differ between the types (a mixture)."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, 4, n)
    means = rng.normal(0.0, 3.0, size=(4, m))
    return rng.normal(size=(n, m)) + means[group]


def test_state_test_holds_its_rate_on_a_mixture_where_fishers_z_does_not() -> None:
    from cape.causal.postprocess import state_partial_correlation_tests

    X = _mean_shift_null(1500, 40, seed=3)
    assert edge_budget(X, 0.3, test="fisher") > 20      # the types' mean shifts look like dependence
    _, p = state_partial_correlation_tests(X)
    assert 0.03 <= np.mean(p < 0.05) <= 0.07 and edge_budget(X, 0.3, test="state") <= 2
    X[:, 1] += 0.3 * (X[:, 0] - X[:, 0].mean())            # one real pair, within every type
    (rows, cols), p = budget_tests(X, "state")
    assert p[np.flatnonzero((rows == 0) & (cols == 1))[0]] < 1e-6 and edge_budget(X, 0.05, test="state") >= 1
