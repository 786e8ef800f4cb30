"""NOTEARS acyclicity h(A) = tr(exp(A∘A)) − M, exactly, for dense A and for low-rank A = UVᵀ.

For A = UVᵀ (rank r) the Hadamard square has an exact rank-k factorisation A∘A = PQᵀ with k = r(r+1)/2
Khatri–Rao columns: P[:, ab] = w_ab·(u_a∘u_b), Q[:, ab] = v_a∘v_b for a ≤ b (w = 1 on the diagonal, 2 off
it). Since tr((PQᵀ)ʲ) = tr((QᵀP)ʲ) for every j ≥ 1, h = tr(exp(QᵀP)) − k: a k×k exponential instead of an
M×M one. :func:`acyclicity` picks whichever matrix is smaller.

The exponential is evaluated in float64 whatever the input dtype: h is a small difference of two numbers of
size M, which float32 cannot resolve once h approaches the 1e-8 tolerances the augmented Lagrangian uses.
The gradient of tr(exp(C)) is exp(C)ᵀ, so the backward pass reuses the forward exponential instead of
differentiating through the Padé approximant (which costs a 2k×2k exponential).
"""

from __future__ import annotations

import torch

__all__ = [
    "acyclicity",
    "acyclicity_dense",
    "acyclicity_low_rank",
    "acyclicity_power_series",
    "hadamard_square_factors",
    "trace_expm",
]


class _TraceExpm(torch.autograd.Function):
    """tr(exp(C)) with the closed-form gradient exp(C)ᵀ."""

    @staticmethod
    def forward(ctx, C: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        E = torch.linalg.matrix_exp(C.double())
        ctx.save_for_backward(E)
        ctx.in_dtype = C.dtype
        return E.diagonal().sum()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (E,) = ctx.saved_tensors
        return (grad_output.double() * E.T).to(ctx.in_dtype)


def trace_expm(C: torch.Tensor) -> torch.Tensor:
    """tr(exp(C)) of a square matrix, computed in float64, differentiable (returns a float64 scalar)."""
    if C.ndim != 2 or C.shape[0] != C.shape[1]:
        raise ValueError(f"trace_expm needs a square matrix, got shape {tuple(C.shape)}")
    return _TraceExpm.apply(C)


def acyclicity_dense(A: torch.Tensor) -> torch.Tensor:
    """h(A) = tr(exp(A∘A)) − M for a dense M×M matrix (zero iff A is the adjacency of a DAG)."""
    return trace_expm(A * A) - A.shape[0]


def hadamard_square_factors(U: torch.Tensor, V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """P, Q (M×k, k = r(r+1)/2) with (UVᵀ)∘(UVᵀ) = PQᵀ exactly.

    Column (a, b), a ≤ b, of P is w_ab·(u_a∘u_b) and of Q is v_a∘v_b, with w_aa = 1 and w_ab = 2 for a < b.
    """
    if U.shape != V.shape or U.ndim != 2:
        raise ValueError(f"U and V must both be M×r, got {tuple(U.shape)} and {tuple(V.shape)}")
    r = U.shape[1]
    a, b = torch.triu_indices(r, r, device=U.device)
    weight = torch.where(a == b, 1.0, 2.0).to(U.dtype)
    # index_select, not U[:, a]: its backward is an index_add instead of a much slower accumulating index_put.
    P = torch.index_select(U, 1, a) * torch.index_select(U, 1, b) * weight
    Q = torch.index_select(V, 1, a) * torch.index_select(V, 1, b)
    return P, Q


def acyclicity_low_rank(U: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """h(UVᵀ) through the k×k identity h = tr(exp(QᵀP)) − k (exact, see module docstring)."""
    P, Q = hadamard_square_factors(U, V)
    return trace_expm(Q.T @ P) - P.shape[1]


def acyclicity(A: torch.Tensor | None = None, U: torch.Tensor | None = None,
               V: torch.Tensor | None = None) -> torch.Tensor:
    """h for a dense ``A`` or for ``A = U @ V.T``, using the cheaper of the M×M and k×k exponentials."""
    if A is not None:
        return acyclicity_dense(A)
    if U is None or V is None:
        raise ValueError("pass either A or both U and V")
    M, r = U.shape
    if M <= r * (r + 1) // 2:
        return acyclicity_dense(U @ V.T)
    return acyclicity_low_rank(U, V)


def acyclicity_power_series(A: torch.Tensor, terms: int = 30) -> torch.Tensor:
    """Reference h(A) = Σ_{j=1..terms} tr((A∘A)ʲ)/j! (truncated series; for tests, small ‖A∘A‖)."""
    B = (A * A).double()
    total = torch.zeros((), dtype=torch.float64, device=A.device)
    power = torch.eye(B.shape[0], dtype=torch.float64, device=A.device)
    for j in range(1, terms + 1):
        power = power @ B / j  # (A∘A)^j / j!
        total = total + power.diagonal().sum()
    return total
