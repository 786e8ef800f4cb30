"""cape.hyperbolic.hierarchy: Spearman(π, −‖e‖) over a subset of genes, and when it counts as missing."""

from __future__ import annotations

import numpy as np
import pytest

from cape.hyperbolic.hierarchy import MIN_HIERARCHY_SPEARMAN, Hierarchy, hierarchy_spearman


def test_general_genes_near_the_origin_give_rho_one_and_the_reverse_minus_one():
    pi = np.array([0.4, 0.3, 0.2, 0.1])
    radii = np.array([0.1, 0.3, 0.5, 0.9])
    poincare = np.c_[radii, np.zeros(4)]
    assert hierarchy_spearman(pi, poincare) == Hierarchy(pytest.approx(1.0), 4)
    assert hierarchy_spearman(pi, poincare[::-1]).spearman == pytest.approx(-1.0)
    assert not hierarchy_spearman(pi, poincare).missing
    assert hierarchy_spearman(pi, poincare[::-1]).missing


def test_only_the_masked_genes_count():
    # genes 4-7 (no edge, tied π) sit at the origin and would reverse the correlation over all genes
    pi = np.r_[0.4, 0.3, 0.2, 0.1, np.full(4, 0.01)]
    radii = np.r_[0.1, 0.3, 0.5, 0.9, np.zeros(4)]
    poincare = np.c_[np.zeros(8), radii]
    among = np.r_[np.ones(4, bool), np.zeros(4, bool)]
    assert hierarchy_spearman(pi, poincare, among) == Hierarchy(pytest.approx(1.0), 4)
    assert hierarchy_spearman(pi, poincare).spearman < 0


def test_undefined_correlation_is_nan_and_counts_as_missing():
    two = hierarchy_spearman(np.array([0.6, 0.4]), np.array([[0.1], [0.2]]))
    assert np.isnan(two.spearman) and two.n_genes == 2 and two.missing
    tied = hierarchy_spearman(np.full(5, 0.2), np.linspace(0.1, 0.5, 5)[:, None])
    assert np.isnan(tied.spearman) and tied.missing
    at_origin = hierarchy_spearman(np.array([0.5, 0.3, 0.2]), np.zeros((3, 2)))
    assert np.isnan(at_origin.spearman)


def test_threshold_is_inclusive():
    assert not Hierarchy(MIN_HIERARCHY_SPEARMAN, 10).missing
    assert Hierarchy(MIN_HIERARCHY_SPEARMAN - 1e-9, 10).missing
