"""NOTEARS acyclicity h(A) = tr(exp(A∘A)) − M, exactly, for dense A and for low-rank A = UVᵀ.

For A = UVᵀ (rank r) the Hadamard square has an exact rank-k factorisation A∘A = PQᵀ with k = r(r+1)/2
Khatri–Rao columns: P[:, ab] = w_ab·(u_a∘u_b), Q[:, ab] = v_a∘v_b for a ≤ b (w = 1 on the diagonal, 2 off
it). Since tr((PQᵀ)ʲ) = tr((QᵀP)ʲ) for every j ≥ 1, h = tr(exp(QᵀP)) − k: a k×k exponential instead of an
M×M one. :func:`acyclicity` picks whichever matrix is smaller.

The exponential is evaluated in float64 whatever the input dtype: h is a small difference of two numbers of
size M, which float32 cannot resolve once h approaches the 1e-8 tolerances the augmented Lagrangian uses.
The gradient of tr(exp(C)) is exp(C)ᵀ, so the backward pass reuses the forward exponential instead of
differentiating through the Padé approximant (which costs a 2k×2k exponential).

:class:`LinearisedAcyclicity` is the first-order model of h in A∘A around a point A₀,
h̃(A) = h(A₀) + Σ_ij W_ij (A_ij² − A₀_ij²) with W = exp(A₀∘A₀)ᵀ ≥ 0: the same value and gradient
(2W∘A) as h at A₀, and a weighted L2 penalty elsewhere, whose pull on each A_ij is towards 0 and
vanishes with it. The trainer re-linearises every few steps and evaluates h̃ in between at O(M²) per
step (see ``h_every`` in :func:`cape.causal.fit_variational_notears`).

A sparse A whose support falls apart into connected components (directions ignored; :func:`support_blocks`) has a
Hadamard square that is block-diagonal after a permutation, and so is its exponential: ``blocks`` makes h and W one
exponential per component instead of one M×M one (the screened candidates at 2,000 genes leave a largest component of
about three quarters of the genes, so the exponential costs about half as much).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import connected_components

__all__ = [
    "LinearisedAcyclicity",
    "acyclicity",
    "acyclicity_dense",
    "acyclicity_low_rank",
    "acyclicity_power_series",
    "acyclicity_weights",
    "blockwise_matrix_exp",
    "hadamard_square_factors",
    "support_blocks",
    "trace_expm",
]


class _TraceExpm(torch.autograd.Function):
    """tr(exp(C)) with the closed-form gradient exp(C)ᵀ (summed over a batch of matrices)."""

    @staticmethod
    def forward(ctx, C: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        E = torch.linalg.matrix_exp(C.double())
        ctx.save_for_backward(E)
        ctx.in_dtype = C.dtype
        return E.diagonal(dim1=-2, dim2=-1).sum()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (E,) = ctx.saved_tensors
        return (grad_output.double() * E.transpose(-2, -1)).to(ctx.in_dtype)


def trace_expm(C: torch.Tensor) -> torch.Tensor:
    """tr(exp(C)) of a square matrix (or the sum over a batch of them, …×n×n), computed in float64,
    differentiable (returns a float64 scalar)."""
    if C.ndim < 2 or C.shape[-1] != C.shape[-2]:
        raise ValueError(f"trace_expm needs a square matrix, got shape {tuple(C.shape)}")
    return _TraceExpm.apply(C)


def support_blocks(rows, cols, n: int) -> list[torch.Tensor]:
    """The connected components, of more than one gene, of the graph on ``n`` genes with the edges ``rows[e]`` –
    ``cols[e]`` (directions ignored), grouped by size: one G×s index tensor per size s (G components of s genes, each
    row sorted), the largest size first. A matrix that is zero off the diagonal except at those edges is
    block-diagonal over the components after a permutation, and so are its powers and its exponential; components of
    one size share one batched exponential."""
    rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    graph = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    _, label = connected_components(graph, directed=False)
    order = np.argsort(label, kind="stable")  # genes by component, ascending within each
    sizes = np.bincount(label)
    genes = np.split(order, np.cumsum(sizes)[:-1])
    return [torch.as_tensor(np.stack([g for g in genes if g.size == size]))
            for size in sorted({int(k) for k in sizes if k > 1}, reverse=True)]


def _block_index(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return blocks[:, :, None], blocks[:, None, :]


def blockwise_matrix_exp(C: torch.Tensor, blocks: list[torch.Tensor]) -> torch.Tensor:
    """exp(C) in float64 for a square C that is zero off its diagonal outside the components ``blocks``
    (:func:`support_blocks`, index tensors on C's device): one batched exponential per component size, exp(C_ii)
    for the genes outside every component."""
    C = C.double()
    E = torch.diag(torch.exp(C.diagonal()))
    for group in blocks:
        index = _block_index(group)
        E[index] = torch.linalg.matrix_exp(C[index])
    return E


def acyclicity_dense(A: torch.Tensor, blocks: list[torch.Tensor] | None = None) -> torch.Tensor:
    """h(A) = tr(exp(A∘A)) − M for a dense M×M matrix (zero iff A is the adjacency of a DAG); with ``blocks``
    (:func:`support_blocks` of A's support), one exponential per block, the same h."""
    C = A * A
    if blocks is None:
        return trace_expm(C) - A.shape[0]
    outside = torch.ones(A.shape[0], dtype=torch.bool, device=A.device)
    for group in blocks:
        outside[group.reshape(-1)] = False
    h = (torch.exp(C.diagonal()[outside].double()) - 1.0).sum()
    for group in blocks:
        h = h + trace_expm(C[_block_index(group)]) - group.numel()
    return h


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
               V: torch.Tensor | None = None, blocks: list[torch.Tensor] | None = None) -> torch.Tensor:
    """h for a dense ``A`` (``blocks``: as for :func:`acyclicity_dense`) or for ``A = U @ V.T``, using the cheaper of
    the M×M and k×k exponentials."""
    if A is not None:
        return acyclicity_dense(A, blocks)
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


def acyclicity_weights(A: torch.Tensor | None = None, U: torch.Tensor | None = None,
                       V: torch.Tensor | None = None, blocks: list[torch.Tensor] | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """h(A) and W = exp(A∘A)ᵀ (M×M), both float64, for a dense ``A`` (``blocks``: :func:`support_blocks` of its
    support, one exponential per block) or for ``A = U @ V.T``.

    The gradient of h at A is 2W∘A. W comes from the M×M exponential while M ≤ 2k; for larger M from
    the 2k×2k block exponential exp([[C, I], [0, 0]]) = [[exp(C), φ(C)], [0, I]] with C = QᵀP and
    φ(C) = Σ_j Cʲ/(j+1)!, since exp(PQᵀ) = I + P φ(C) Qᵀ (exact; k = r(r+1)/2, see the module docstring).
    """
    if A is None:
        if U is None or V is None:
            raise ValueError("pass either A or both U and V")
        M, r = U.shape
        k = r * (r + 1) // 2
        if M > 2 * k:
            P, Q = hadamard_square_factors(U.double(), V.double())
            block = torch.zeros(2 * k, 2 * k, dtype=torch.float64, device=U.device)
            block[:k, :k] = Q.T @ P
            block[:k, k:] = torch.eye(k, dtype=torch.float64, device=U.device)
            F = torch.linalg.matrix_exp(block)
            h = F[:k, :k].diagonal().sum() - k
            W = Q @ F[:k, k:].T @ P.T
            W.diagonal().add_(1.0)
            return h, W
        A = U.double() @ V.double().T
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"A must be a square matrix, got shape {tuple(A.shape)}")
    A = A.double()
    E = torch.linalg.matrix_exp(A * A) if blocks is None else blockwise_matrix_exp(A * A, blocks)
    return E.diagonal().sum() - A.shape[0], E.T.contiguous()


class LinearisedAcyclicity:
    """h̃(A) = h(A₀) + Σ_ij W_ij (A_ij² − A₀_ij²), W = exp(A₀∘A₀)ᵀ: h's first-order model in A∘A at A₀.

    Build it at the current matrix ``A`` (no gradient is tracked; pass the factors ``U``, ``V`` of
    A = UVᵀ too to get h and W through the k×k route, see :func:`acyclicity_weights`), then call it on
    later matrices computed the same way (differentiable, returns a float64 scalar). At A = A₀ value and
    gradient are h's exactly. W ≥ 0, so the gradient 2W∘A always shrinks |A_ij|, by less as A_ij nears
    0: unlike a reused gradient, it cannot push a weight through zero. Cost per call O(M²).

    ``entries`` = (rows, cols) keeps W and A₀ at those entries only, for an A that is zero elsewhere (a sparse A):
    calls then take the vector of A's values there, A[rows, cols], and cost O(entries); ``blocks``
    (:func:`support_blocks` of those entries) computes W one block at a time.
    """

    def __init__(self, A: torch.Tensor, U: torch.Tensor | None = None, V: torch.Tensor | None = None,
                 entries: tuple[torch.Tensor, torch.Tensor] | None = None,
                 blocks: list[torch.Tensor] | None = None) -> None:
        with torch.no_grad():
            self.h0, W = acyclicity_weights(U=U, V=V) if U is not None else acyclicity_weights(A, blocks=blocks)
            self.A0 = A.detach().clone()
            self.weights = W.to(A.dtype)
            if entries is not None:
                self.A0, self.weights = self.A0[entries].contiguous(), self.weights[entries].contiguous()

    def assign_(self, other: LinearisedAcyclicity) -> LinearisedAcyclicity:
        """Move to ``other``'s point of linearisation in place: a captured CUDA graph that reads this model's
        tensors then uses the new point (the shapes must match)."""
        with torch.no_grad():
            for mine, theirs in ((self.h0, other.h0), (self.A0, other.A0), (self.weights, other.weights)):
                mine.copy_(theirs)
        return self

    def __call__(self, A: torch.Tensor) -> torch.Tensor:
        if A.shape != self.A0.shape:
            raise ValueError(f"linearised at a matrix of shape {tuple(self.A0.shape)}, called on {tuple(A.shape)}")
        return self.h0 + _WeightedSquareChange.apply(A, self.weights, self.A0).double()

    def low_rank_l1_and_h(self, U: torch.Tensor, V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """‖UVᵀ − diag(UVᵀ)‖₁ and h̃(UVᵀ) from one M×M product (the penalties of a low-rank step).

        The same values and gradients as ``(U @ V.T).abs().sum() − |diag|.sum()`` and ``self(U @ V.T)``,
        but UVᵀ is formed once and the backward pass maps the summed M×M gradient through a single pair of
        M×M×r products instead of one pair per term.
        """
        l1, change = _LowRankL1AndChange.apply(U, V, self.weights, self.A0)
        return l1, self.h0 + change.double()


class _WeightedSquareChange(torch.autograd.Function):
    """Σ W (A − A₀)(A + A₀) = Σ W (A² − A₀²) with the gradient 2W∘A in one pass (A: M×M, or a sparse A's values)."""

    @staticmethod
    def forward(ctx, A: torch.Tensor, W: torch.Tensor, A0: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(A, W)
        # The change is formed before summing, so float32 resolves it however small h is.
        return ((A - A0) * (A + A0)).mul_(W).sum()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        A, W = ctx.saved_tensors
        return (2.0 * grad_output) * W * A, None, None


class _LowRankL1AndChange(torch.autograd.Function):
    """(‖A‖₁ off the diagonal, Σ W (A² − A₀²)) at A = UVᵀ, with one M×M gradient G and G·V, Gᵀ·U."""

    @staticmethod
    def forward(ctx, U: torch.Tensor, V: torch.Tensor, W: torch.Tensor, A0: torch.Tensor):  # type: ignore[override]
        A = U @ V.T
        ctx.save_for_backward(U, V, W, A)
        l1 = A.abs().sum() - A.diagonal().abs().sum()
        return l1, ((A - A0) * (A + A0)).mul_(W).sum()

    @staticmethod
    def backward(ctx, grad_l1: torch.Tensor, grad_change: torch.Tensor):  # type: ignore[override]
        U, V, W, A = ctx.saved_tensors
        G = torch.sign(A).mul_(grad_l1)
        G.diagonal().zero_()
        G.add_(W * A * (2.0 * grad_change))  # a tensor factor, not alpha=float(...): no wait for the device
        return G @ V, G.T @ U, None, None
