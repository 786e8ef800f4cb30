"""Acyclicity h(A) = tr(exp(A∘A)) − M: exact dense, low-rank k×k identity and a truncated power series agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cape.causal import (
    LinearisedAcyclicity,
    acyclicity,
    acyclicity_dense,
    acyclicity_low_rank,
    acyclicity_power_series,
    acyclicity_weights,
    blockwise_matrix_exp,
    hadamard_square_factors,
    support_blocks,
    trace_expm,
)


def _random_factors(M: int, r: int, seed: int, scale: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    U = torch.randn(M, r, generator=gen, dtype=torch.float64) * scale / r**0.5
    V = torch.randn(M, r, generator=gen, dtype=torch.float64) * scale
    return U, V


@settings(max_examples=25, deadline=None)
@given(M=st.integers(2, 12), seed=st.integers(0, 10_000), scale=st.floats(0.05, 0.6))
def test_dense_matches_power_series_value_and_gradient(M: int, seed: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    A = (torch.randn(M, M, generator=gen, dtype=torch.float64) * scale / M**0.5).requires_grad_()
    h = acyclicity_dense(A)
    (g,) = torch.autograd.grad(h, A)
    A2 = A.detach().clone().requires_grad_()
    h_ref = acyclicity_power_series(A2, terms=40)
    (g_ref,) = torch.autograd.grad(h_ref, A2)
    # torch.linalg.matrix_exp is accurate to ~1e-10 absolute in float64
    assert h.item() == pytest.approx(h_ref.item(), rel=1e-7, abs=1e-9)
    torch.testing.assert_close(g, g_ref, rtol=1e-7, atol=1e-9)
    # closed form (Supp. A.1): ∇h = exp(A∘A)ᵀ ∘ 2A
    closed = torch.linalg.matrix_exp(A.detach() * A.detach()).T * 2 * A.detach()
    torch.testing.assert_close(g, closed, rtol=1e-9, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(M=st.integers(2, 30), r=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_khatri_rao_factors_reproduce_hadamard_square(M: int, r: int, seed: int) -> None:
    U, V = _random_factors(M, r, seed)
    P, Q = hadamard_square_factors(U, V)
    assert P.shape == Q.shape == (M, r * (r + 1) // 2)
    A = U @ V.T
    torch.testing.assert_close(P @ Q.T, A * A, rtol=1e-10, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(M=st.integers(2, 25), r=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_low_rank_matches_dense_and_series_including_gradients(M: int, r: int, seed: int) -> None:
    U, V = _random_factors(M, r, seed)
    U1, V1 = U.clone().requires_grad_(), V.clone().requires_grad_()
    h_low = acyclicity_low_rank(U1, V1)
    gU_low, gV_low = torch.autograd.grad(h_low, (U1, V1))
    U2, V2 = U.clone().requires_grad_(), V.clone().requires_grad_()
    h_dense = acyclicity_dense(U2 @ V2.T)
    gU_dense, gV_dense = torch.autograd.grad(h_dense, (U2, V2))
    U3, V3 = U.clone().requires_grad_(), V.clone().requires_grad_()
    h_series = acyclicity_power_series(U3 @ V3.T, terms=40)
    gU_series, gV_series = torch.autograd.grad(h_series, (U3, V3))
    assert h_low.item() == pytest.approx(h_dense.item(), rel=1e-7, abs=1e-9)
    assert h_low.item() == pytest.approx(h_series.item(), rel=1e-7, abs=1e-9)
    for a, b in [(gU_low, gU_dense), (gV_low, gV_dense), (gU_low, gU_series), (gV_low, gV_series)]:
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


def test_zero_exactly_on_dags_and_positive_on_cycles() -> None:
    rng = np.random.default_rng(0)
    M = 8
    upper = np.triu(rng.normal(size=(M, M)), k=1)
    perm = rng.permutation(M)
    dag = torch.as_tensor(upper[np.ix_(perm, perm)])
    assert acyclicity_dense(dag).item() == pytest.approx(0.0, abs=1e-9)
    cyclic = dag.clone()
    cyclic[perm[-1], perm[0]] = 0.5  # closes a cycle
    assert acyclicity_dense(cyclic).item() > 1e-3
    self_loop = torch.zeros(M, M, dtype=torch.float64)
    self_loop[2, 2] = 0.3
    assert acyclicity_dense(self_loop).item() == pytest.approx(np.expm1(0.09))


def test_low_rank_dag_has_zero_h() -> None:
    # U V^T strictly upper triangular: u_i nonzero only in coordinate i, v_j in coordinates < j.
    M = 6
    U = torch.eye(M, dtype=torch.float64)
    V = torch.triu(torch.ones(M, M, dtype=torch.float64), diagonal=1).T
    assert acyclicity_low_rank(U[:, :5], V[:, :5]).item() == pytest.approx(0.0, abs=1e-12)


def test_float32_inputs_keep_precision_and_dtype_of_gradient() -> None:
    U, V = _random_factors(50, 4, 3, scale=0.05)
    U32, V32 = U.float().requires_grad_(), V.float().requires_grad_()
    h = acyclicity_low_rank(U32, V32)
    assert h.dtype == torch.float64
    assert h.item() == pytest.approx(acyclicity_dense(U.float().double() @ V.float().double().T).item(), rel=1e-6)
    h.backward()
    assert U32.grad.dtype == torch.float32


def test_dispatcher_and_trace_expm_gradcheck() -> None:
    U, V = _random_factors(9, 4, 1)  # M = 9 ≤ k = 10: dense path
    assert acyclicity(U=U, V=V).item() == pytest.approx(acyclicity_low_rank(U, V).item(), rel=1e-10)
    U, V = _random_factors(30, 3, 2)  # M = 30 > k = 6: low-rank path
    assert acyclicity(U=U, V=V).item() == pytest.approx(acyclicity_dense(U @ V.T).item(), rel=1e-10)
    C = torch.randn(5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).requires_grad_()
    assert torch.autograd.gradcheck(trace_expm, (C,))
    with pytest.raises(ValueError):
        trace_expm(torch.zeros(2, 3))


@settings(max_examples=20, deadline=None)
@given(M=st.integers(2, 20), r=st.integers(1, 3), seed=st.integers(0, 10_000), dense=st.booleans())
def test_acyclicity_weights_are_the_transposed_exponential(M: int, r: int, seed: int, dense: bool) -> None:
    # M > 2k (k = r(r+1)/2) takes the 2k×2k block route, smaller M the M×M exponential: both exact.
    U, V = _random_factors(M, r, seed, scale=0.6)
    A = (U @ V.T).requires_grad_()
    h, W = acyclicity_weights(A.detach()) if dense else acyclicity_weights(U=U, V=V)
    h_ref = acyclicity_dense(A)
    (grad,) = torch.autograd.grad(h_ref, A)
    assert h.dtype == W.dtype == torch.float64
    assert h.item() == pytest.approx(h_ref.item(), rel=1e-9, abs=1e-12)
    E = torch.linalg.matrix_exp(A.detach() ** 2)
    # within the exponentials' round-off (~1e-12 of the largest entry), which a tiny entry's relative error exceeds
    torch.testing.assert_close(W, E.T, rtol=1e-10, atol=1e-11 * float(E.abs().max()))
    torch.testing.assert_close(2 * W * A.detach(), grad, rtol=1e-9, atol=1e-12)
    assert torch.all(W >= 0)


def test_acyclicity_weights_validate_input() -> None:
    with pytest.raises(ValueError, match="either A or both U and V"):
        acyclicity_weights(U=torch.zeros(3, 1))
    with pytest.raises(ValueError, match="square"):
        acyclicity_weights(torch.zeros(3, 2))


@pytest.mark.parametrize("factored", [False, True])
def test_linearised_acyclicity_is_h_to_first_order(factored: bool) -> None:
    U, V = _random_factors(12, 2, 3, scale=0.8)  # 12 > 2k = 6: the block route when factored
    A0 = U @ V.T
    model = LinearisedAcyclicity(A0, U, V) if factored else LinearisedAcyclicity(A0)
    A = A0.clone().requires_grad_()
    value = model(A)
    (grad,) = torch.autograd.grad(value, A)
    A_ref = A0.clone().requires_grad_()
    h = acyclicity_dense(A_ref)
    (grad_ref,) = torch.autograd.grad(h, A_ref)
    assert value.item() == pytest.approx(h.item(), rel=1e-10)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-9, atol=1e-12)
    # away from A0 the error is second order: halving the step quarters it
    direction = torch.randn(12, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    errors = [abs(model(A0 + eps * direction).item() - acyclicity_dense(A0 + eps * direction).item())
              for eps in (1e-3, 5e-4)]
    assert errors[0] / errors[1] == pytest.approx(4.0, rel=0.05)
    # the pull on each weight is towards zero (W ≥ 0), and none on a zero weight
    moved = A0 + 0.3 * direction
    moved[0, 1] = 0.0
    moved.requires_grad_()
    (g,) = torch.autograd.grad(model(moved), moved)
    assert torch.all(g * moved.detach() >= 0) and g[0, 1] == 0


def test_fused_low_rank_l1_and_linearised_h_match_the_separate_terms() -> None:
    gen = torch.Generator().manual_seed(3)
    U0, V0 = torch.randn(30, 4, generator=gen) * 0.3, torch.randn(30, 4, generator=gen) * 0.3
    linearised = LinearisedAcyclicity(U0 @ V0.T, U0, V0)
    U = (U0 + 0.05 * torch.randn(30, 4, generator=gen)).requires_grad_()
    V = (V0 + 0.05 * torch.randn(30, 4, generator=gen)).requires_grad_()
    l1, h = linearised.low_rank_l1_and_h(U, V)
    (0.7 * l1 + 3.0 * h).backward()
    fused = (float(l1), float(h), U.grad.clone(), V.grad.clone())
    U.grad = V.grad = None
    A = U @ V.T
    l1_ref = A.abs().sum() - A.diagonal().abs().sum()
    h_ref = linearised(U @ V.T)
    (0.7 * l1_ref + 3.0 * h_ref).backward()
    assert fused[0] == pytest.approx(float(l1_ref), rel=1e-6)
    assert fused[1] == pytest.approx(float(h_ref), rel=1e-9, abs=1e-12)
    torch.testing.assert_close(fused[2], U.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused[3], V.grad, rtol=1e-5, atol=1e-6)


def _sparse_support(M: int, n_edges: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random symmetric candidate pairs (both directions), as the screen gives them: several components."""
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, M, n_edges), rng.integers(0, M, n_edges)
    keep = i != j
    rows, cols = np.r_[i[keep], j[keep]], np.r_[j[keep], i[keep]]
    pairs = np.unique(np.c_[rows, cols], axis=0)
    return pairs[:, 0], pairs[:, 1]


@settings(max_examples=25, deadline=None)
@given(M=st.integers(2, 40), density=st.floats(0.0, 1.5), seed=st.integers(0, 10_000))
def test_blockwise_exponential_is_the_exponential_of_a_sparse_support(M: int, density: float, seed: int) -> None:
    rows, cols = _sparse_support(M, int(density * M), seed)
    blocks = support_blocks(rows, cols, M)
    covered = torch.cat([b.reshape(-1) for b in blocks]).numpy() if blocks else np.zeros(0, dtype=int)
    assert np.unique(covered).size == covered.size  # disjoint
    assert np.array_equal(np.sort(covered), np.unique(np.r_[rows, cols]))  # every gene with an edge, no other
    assert [b.shape[1] for b in blocks] == sorted({b.shape[1] for b in blocks}, reverse=True)  # one group per size
    assert all(b.shape[1] > 1 for b in blocks)
    gen = torch.Generator().manual_seed(seed)
    A = torch.zeros(M, M, dtype=torch.float64)
    A[torch.as_tensor(rows), torch.as_tensor(cols)] = torch.randn(rows.size, generator=gen, dtype=torch.float64) * 0.6
    # both within the exponential's own round-off (Padé with scaling and squaring: ~1e-12 of its largest entry)
    full = torch.linalg.matrix_exp(A * A)
    tol = {"rtol": 1e-9, "atol": 1e-11 * float(full.abs().max())}
    torch.testing.assert_close(blockwise_matrix_exp(A * A, blocks), full, **tol)
    h_full, W_full = acyclicity_weights(A)
    h_blocks, W_blocks = acyclicity_weights(A, blocks=blocks)
    torch.testing.assert_close(h_blocks, h_full, **tol)
    torch.testing.assert_close(W_blocks, W_full, **tol)
    # h through the blocks has h's gradient
    a, b = A.clone().requires_grad_(True), A.clone().requires_grad_(True)
    acyclicity_dense(a).backward()
    acyclicity(b, blocks=blocks).backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-11 * float(a.grad.abs().max() + 1))


def test_a_sparse_models_h_goes_through_its_components() -> None:
    from cape.causal import VariationalNotears

    M = 30
    rows, cols = _sparse_support(M, 20, 1)
    candidates = np.zeros((M, M), dtype=bool)
    candidates[rows, cols] = True
    model = VariationalNotears(M, candidates=candidates, sparse=True)
    with torch.no_grad():
        model.edge_weight.copy_(torch.linspace(-0.5, 0.7, model.edge_weight.numel()))
    blocks = model.support_blocks()
    assert [tuple(b.shape) for b in blocks] == [tuple(b.shape) for b in support_blocks(rows, cols, M)]
    assert sum(b.numel() for b in blocks) == np.unique(np.r_[rows, cols]).size < M
    assert float(model.acyclicity()) == pytest.approx(float(acyclicity_dense(model.adjacency())), rel=1e-10)
    linearised = LinearisedAcyclicity(model.acyclicity_matrix(), entries=model.edge_index(), blocks=blocks)
    dense = LinearisedAcyclicity(model.acyclicity_matrix(), entries=model.edge_index())
    torch.testing.assert_close(linearised.weights, dense.weights, rtol=1e-6, atol=1e-7)
    assert VariationalNotears(M, candidates=candidates).support_blocks() is None  # a dense A: one exponential
