"""The edge budget's fill: where fewer gene pairs than genes pass the budget's rate, the pairs significant at the
looser fill rate raise the budget towards one pair per gene, never past it, and never past what the looser test
calls; on independent genes it adds nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cape.causal import (
    BUDGET_FDR,
    BUDGET_FILL_FDR,
    BudgetCount,
    CausalConfig,
    count_budget,
    decoy_count,
    edge_budget,
    fill_budget,
)
from cape.causal.pipeline import edge_budget_for
from cape.causal.postprocess import _bh_count, budget_tests, decoy_counts, state_partial_correlation_tests

counts = st.integers(0, 500)


@settings(max_examples=200, deadline=None)
@given(strict=counts, loose=counts, n_genes=st.integers(0, 300))
def test_the_fill_raises_the_strict_count_towards_one_pair_per_gene_and_no_further(strict, loose, n_genes):
    budget = fill_budget(strict, loose, n_genes)
    assert budget >= strict  # never fewer than the strict count
    assert budget <= max(strict, n_genes) and budget <= max(strict, loose)  # nor past one per gene or the loose count
    if strict >= n_genes:
        assert budget == strict  # enough pairs already: the strict count alone
    else:
        assert budget == max(strict, min(n_genes, loose))
    assert fill_budget(strict, loose + 1, n_genes) >= budget  # more loose pairs never shrink it


def test_fill_budget_refuses_negative_counts():
    with pytest.raises(ValueError, match="≥ 0"):
        fill_budget(-1, 3, 10)


def _weak_chain(n_cells: int = 300, n_genes: int = 40, weight: float = 0.25, seed: int = 0) -> np.ndarray:
    """g0 → g1 → … with weak edges: on 300 cells some neighbouring pairs pass at 20 % and not at 5 %."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_cells, n_genes))
    for j in range(1, n_genes):
        X[:, j] += weight * X[:, j - 1]
    return X


def test_count_budget_counts_both_rates_from_the_same_tests_and_one_permuted_copy():
    X = _weak_chain()
    count = count_budget(X, None, seed=2)
    (_, p), (_, p_state) = budget_tests(X), state_partial_correlation_tests(X, seed=2)
    assert count.significant == edge_budget(X, BUDGET_FDR)
    # the fill's pairs pass the budget's test and the test given the cell states
    loose = _bh_count(np.maximum(p, p_state), BUDGET_FILL_FDR)
    assert count.significant_fill == loose <= edge_budget(X, BUDGET_FILL_FDR)
    assert (count.permuted, count.permuted_fill) == decoy_counts(X, (BUDGET_FDR, BUDGET_FILL_FDR), seed=2)
    assert count.permuted == decoy_count(X, BUDGET_FDR, seed=2)
    assert count.strict < X.shape[1] and count.filled and count.n_pairs > count.strict
    assert count.n_pairs == fill_budget(count.strict, count.significant_fill - count.permuted_fill, X.shape[1])
    strict = count_budget(X, None, fill_fdr=None, seed=2)
    assert strict.significant_fill is None and strict.n_pairs == strict.strict == count.strict and not strict.filled


def test_budget_count_takes_the_permuted_copy_off_each_rate():
    count = BudgetCount(n_genes=50, significant=12, permuted=4, significant_fill=40, permuted_fill=15)
    assert count.strict == 8 and count.n_pairs == 25 and count.filled
    assert BudgetCount(50, 3, 9, 5, 9).n_pairs == 0  # the copy calls more than the data: nothing


@pytest.mark.parametrize("seed", range(3))
def test_the_fill_adds_no_pair_on_independent_genes(seed):
    X = np.random.default_rng(seed).normal(size=(300, 40))
    count = count_budget(X, None, seed=seed)
    assert count.significant_fill - count.permuted_fill <= 1 and count.n_pairs <= 1


def _types_without_regulation(n_cells: int = 2000, n_genes: int = 120, seed: int = 0) -> np.ndarray:
    """Log-normalised NB counts of 5 cell types whose genes regulate nothing: each type scales each gene's share."""
    rng = np.random.default_rng(seed)
    types = rng.integers(0, 5, n_cells)
    share = rng.lognormal(0.0, 1.5, n_genes) * np.exp(rng.normal(0.0, 1.0, (5, n_genes)))[types]
    size = 3000 * rng.lognormal(0.0, 0.4, n_cells)
    mean = share / share.sum(axis=1, keepdims=True) * size[:, None]
    return np.log1p(rng.negative_binomial(2.0, 2.0 / (2.0 + mean)) / size[:, None] * 1e4)


def test_the_fill_takes_no_pair_that_the_cell_types_alone_make():
    X = _types_without_regulation()
    loose = edge_budget(X, BUDGET_FILL_FDR)
    count = count_budget(X, None, seed=0)
    assert count.strict < X.shape[1]  # fewer pairs than genes at 5 %: the fill is needed
    assert loose > 2 * count.strict  # without the states the looser rate calls many pairs the types make
    assert count.n_pairs == count.strict  # given the states they do not pass: nothing filled


def test_the_pipeline_records_the_fill_and_it_can_be_turned_off():
    X = _weak_chain()
    budget, record, _ = edge_budget_for(X, None, CausalConfig(), seed=2)
    assert record["filled"] and record["fill_fdr"] == BUDGET_FILL_FDR and budget == record["n_pairs"]
    assert record["n_pairs_strict"] == record["n_pairs_significant"] - record["n_pairs_permuted"] < budget <= 40
    off, record_off, _ = edge_budget_for(X, None, CausalConfig(budget_fill_fdr=None), seed=2)
    assert off == record["n_pairs_strict"] and "fill_fdr" not in record_off and "filled" not in record_off
    # a fill rate no looser than the budget's changes nothing
    same, _, _ = edge_budget_for(X, None, CausalConfig(budget_fill_fdr=BUDGET_FDR), seed=2)
    assert same == off


def test_enough_pairs_at_the_budget_rate_leave_the_fill_unused():
    X = _weak_chain(n_cells=3000, n_genes=20, weight=0.5)  # every neighbouring pair and more pass at 5 %
    budget, record, _ = edge_budget_for(X, None, CausalConfig(), seed=0)
    assert record["n_pairs_strict"] >= 20 and budget == record["n_pairs_strict"] and not record["filled"]
