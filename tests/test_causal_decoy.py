"""The edge budget's permuted copy: where Fisher's z does not fit the genes (detected in a handful of cells), the
test calls pairs on independent genes, the permuted copy calls as many, and the budget counts the difference."""

from __future__ import annotations

import logging

import numpy as np
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from cape.causal import CausalConfig, decoy_count, edge_budget, permuted_genes
from cape.causal.pipeline import edge_budget_for


def _sparse_independent(n_cells: int = 400, n_genes: int = 150, rate: float = 0.02, seed: int = 0) -> np.ndarray:
    """Independent genes, each detected in a handful of cells (log1p of Poisson counts, varying library sizes)."""
    rng = np.random.default_rng(seed)
    X = np.log1p(rng.poisson(rate, (n_cells, n_genes)) * rng.lognormal(0, 0.3, (n_cells, 1)))
    return X[:, X.std(axis=0) > 0]


def _chain(n_cells: int = 2000, n_genes: int = 30, seed: int = 0) -> np.ndarray:
    """A linear Gaussian chain g0 → g1 → …: every neighbouring pair depends."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_cells, n_genes))
    for j in range(1, n_genes):
        X[:, j] += 0.8 * X[:, j - 1]
    return X


@settings(max_examples=25, deadline=None)
@given(n_cells=st.integers(2, 40), n_genes=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_permuted_genes_permutes_each_gene_on_its_own(n_cells, n_genes, seed):
    X = np.random.default_rng(seed).normal(size=(n_cells, n_genes))
    P = permuted_genes(X, seed)
    assert P.shape == X.shape
    np.testing.assert_array_equal(np.sort(P, axis=0), np.sort(X, axis=0))  # each gene keeps its values
    np.testing.assert_array_equal(P, permuted_genes(X, seed))  # seeded
    np.testing.assert_array_equal(P, permuted_genes(sp.csr_matrix(X), seed))  # sparse in, the same copy


def test_the_genes_are_permuted_apart():
    X = np.repeat(np.arange(500.0)[:, None], 4, axis=1)  # four identical genes
    P = permuted_genes(X, 0)
    assert abs(np.corrcoef(P.T)[np.triu_indices(4, 1)]).max() < 0.2
    assert not np.array_equal(P, permuted_genes(X, 1))


def test_fisher_calls_pairs_of_independent_sparse_genes_and_the_permuted_copy_as_many():
    X = _sparse_independent()
    significant, decoy = edge_budget(X, test="fisher"), decoy_count(X, test="fisher")
    assert significant > 50 and decoy > 0.5 * significant  # the test's null does not fit genes seen in ~8 cells
    assert edge_budget(X, test="robust") == decoy_count(X, test="robust") == 0  # the robust test holds its level
    assert edge_budget(X) == decoy_count(X) == 0  # and so does the default, where both tests must agree


def test_where_the_test_fits_the_permuted_copy_calls_nothing():
    X = _chain()
    assert edge_budget(X) >= 29 and decoy_count(X) == 0


def test_the_budget_counts_the_difference_and_warns_when_the_copy_calls_many(caplog):
    config = CausalConfig(budget_test="fisher", budget_fill_fdr=None)  # the strict count alone
    X = _sparse_independent(rate=0.02)
    with caplog.at_level(logging.WARNING, logger="cape"):
        budget, record, _ = edge_budget_for(X, None, config, seed=3)
    assert record["n_pairs_significant"] == edge_budget(X, test="fisher")
    assert record["n_pairs_permuted"] == decoy_count(X, test="fisher", seed=3)
    expected = record["n_pairs_significant"] - record["n_pairs_permuted"]
    assert record["n_pairs"] == max(expected, 0) and budget == (expected if expected > 0 else None)
    assert "permuted on its own" in caplog.text and "min_cells" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cape"):
        budget, record, _ = edge_budget_for(_chain(), None, config, seed=3)
    assert budget == record["n_pairs_significant"] and record["n_pairs_permuted"] == 0
    assert "permuted" not in caplog.text
