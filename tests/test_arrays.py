from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from cape import _arrays
from cape._arrays import correlation_matrix, cross_products, zscore_columns


def test_numpy_standard_deviation_of_a_constant_column_is_round_off_not_zero() -> None:
    # The reason zscore_columns needs a tolerance: a plain sd > 0 test would divide by this.
    assert 0.0 < np.full(37, 0.1).std() < 1e-15


@pytest.mark.parametrize("value", [0.1, -3.7, 1e6, 0.0, 1e-30])
def test_constant_columns_are_exactly_zero_despite_round_off(value: float) -> None:
    x = np.column_stack([np.full(37, value), np.linspace(0.0, 1.0, 37)])
    z, constant = zscore_columns(x)
    assert constant.tolist() == [True, False]
    assert np.all(z[:, 0] == 0.0)
    np.testing.assert_allclose(z[:, 1].mean(), 0.0, atol=1e-12)
    np.testing.assert_allclose(z[:, 1].std(), 1.0)


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 30), st.integers(1, 6), st.integers(0, 2**32 - 1),
       st.floats(1e-3, 1e3), st.floats(-1e3, 1e3))
def test_zscores_invariant_to_positive_affine_maps(n: int, m: int, seed: int, scale: float, shift: float) -> None:
    x = np.random.default_rng(seed).normal(size=(n, m))
    z, constant = zscore_columns(x)
    z2, constant2 = zscore_columns(scale * x + shift)
    assert not constant.any() and not constant2.any()
    np.testing.assert_allclose(z2, z, atol=1e-7)


def test_sparse_input_matches_dense() -> None:
    x = sp.random(20, 5, density=0.4, random_state=0, format="csr")
    np.testing.assert_allclose(zscore_columns(x)[0], zscore_columns(x.toarray())[0])


@pytest.mark.parametrize("density", [0.01, 0.3, 1.0])
def test_cross_products_of_a_sparse_matrix_are_the_dense_ones_whichever_way_they_are_summed(density, monkeypatch):
    # a block smaller than the rows, so that the blocked sum is exercised; the densities fall on both sides of the line
    monkeypatch.setattr(_arrays, "GRAM_BLOCK_ROWS", 7)
    x = sp.random(50, 9, density=density, format="csr", random_state=1, dtype=np.float32)
    np.testing.assert_allclose(cross_products(x), x.toarray().astype(np.float64).T @ x.toarray(), rtol=1e-12)
    np.testing.assert_allclose(correlation_matrix(x), correlation_matrix(x.toarray()), atol=1e-12)


def test_a_constant_column_has_no_correlation() -> None:
    x = np.column_stack([np.arange(10.0), np.full(10, 2.0), np.arange(10.0) ** 2])
    c = correlation_matrix(sp.csr_matrix(x))
    assert np.all(c[1] == 0.0) and np.all(c[:, 1] == 0.0)
    np.testing.assert_allclose(c[[0, 2]][:, [0, 2]], np.corrcoef(x[:, [0, 2]], rowvar=False))
