"""Post-processing: threshold τ, then break every remaining cycle at its weakest edge — always a DAG."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cape.causal import is_dag, make_dag, threshold


@settings(max_examples=60, deadline=None)
@given(M=st.integers(1, 25), seed=st.integers(0, 2**31 - 1), tau=st.floats(0.0, 0.99), density=st.floats(0, 1))
def test_make_dag_always_returns_a_dag_and_only_removes_edges(M: int, seed: int, tau: float,
                                                               density: float) -> None:
    rng = np.random.default_rng(seed)
    A = (rng.normal(size=(M, M)) * (rng.random((M, M)) < density)).astype(np.float32)
    out, removed = make_dag(A, tau)
    assert out.dtype == A.dtype and out.shape == A.shape
    assert is_dag(out)
    kept = out != 0
    # every kept edge was above threshold, with its weight unchanged
    assert np.all(np.abs(A[kept]) > tau)
    np.testing.assert_array_equal(out[kept], A[kept])
    thresholded = threshold(A, tau)
    assert removed == int((thresholded != 0).sum() - kept.sum())


def test_dag_input_is_only_thresholded() -> None:
    rng = np.random.default_rng(1)
    A = np.triu(rng.normal(size=(12, 12)), k=1)
    out, removed = make_dag(A, 0.5)
    assert removed == 0
    np.testing.assert_array_equal(out, np.where(np.abs(A) > 0.5, A, 0))


def test_weakest_edge_of_a_cycle_is_removed() -> None:
    A = np.zeros((4, 4))
    A[0, 1], A[1, 2], A[2, 0] = 0.9, -0.3, 0.8  # cycle 0→1→2→0, weakest |w| is 1→2
    A[2, 3] = 0.25
    out, removed = make_dag(A, 0.2)
    assert removed == 1
    assert out[1, 2] == 0 and out[0, 1] == 0.9 and out[2, 0] == 0.8 and out[2, 3] == 0.25


def test_two_cycles_sharing_nothing_and_self_loops() -> None:
    A = np.zeros((5, 5))
    A[0, 1], A[1, 0] = 0.5, 0.6
    A[2, 3], A[3, 4], A[4, 2] = 0.7, 0.4, 0.9
    A[1, 1] = 3.0  # self-loop: dropped by the threshold step, not counted as cycle breaking
    out, removed = make_dag(A, 0.1)
    assert removed == 2 and is_dag(out)
    assert out[0, 1] == 0 and out[1, 0] == 0.6 and out[3, 4] == 0 and out[1, 1] == 0


def test_threshold_rejects_negative_or_nan_tau() -> None:
    with pytest.raises(ValueError):
        threshold(np.zeros((2, 2)), -0.1)
    with pytest.raises(ValueError):
        threshold(np.zeros((2, 2)), float("nan"))
