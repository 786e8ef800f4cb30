"""Variational NOTEARS (paper Sec. 3.3, Eq. 6–8): a VAE whose encoder and decoder are the nonlinear SEM.

Rows are cells, so with A[i, j] ≠ 0 meaning gene i → gene j:

* encoder (Eq. 6): μ_Z = f(X)(I − A), q(Z|X) = N(μ_Z, diag σ²), where f's output is normalised (centred
  per gene and divided by one scale shared by all genes, or per-gene batch normalisation): without it f
  can shrink and g grow until the KL term, the only place A enters, vanishes and takes every edge with it;
* decoder (Eq. 7): X̂ = g(Z(I − A)⁻¹), g playing the role of f⁻¹;
* −ELBO (Eq. 8) per cell = ½‖X − X̂‖² (unit-variance Gaussian likelihood on standardised data, constant
  dropped) + KL(q(Z|X) ‖ N(0, I)).

By default (``sample_latent=False``) σ = 1 is fixed and the reconstruction term is evaluated at Z = μ_Z,
as DAG-GNN does: the KL is then ½‖f(X)(I − A)‖², a least-squares SEM fit in the learnt feature space.
With ``sample_latent=True`` σ is learnt per gene and Z is drawn by reparameterisation (the full
single-sample ELBO); on our development data that variant recovered fewer edges (see the benchmark notes).

f and g are element-wise 1–64–1 MLPs, one per gene (each gene's scalar goes through its own small
network), with a skip connection so both start near the identity. A is either dense (diagonal masked) or
low rank. Low rank means A = UVᵀ − D with D = diag(UVᵀ) (the self-loops masked out, as in the dense case:
otherwise the data term pulls A_ii towards 1 against the acyclicity penalty, which counts self-loops,
and h cannot fall). D costs O(M·r) (d_i = Σ_a U_ia·V_ia), so the
encoder costs O(B·M·r), and the decoder uses Woodbury with the diagonal base B = I + D,
(B − UVᵀ)⁻¹ = B⁻¹ + B⁻¹U(I_r − VᵀB⁻¹U)⁻¹VᵀB⁻¹, so no M×M matrix is formed per cell. The acyclicity
penalty stays the exact low-rank h(UVᵀ) ≥ h(UVᵀ − D): zero only when the masked A is a DAG and the now
unopposed diagonal is zero.

A dense A can be restricted to candidate edges (``candidates``, e.g. SDCD-style screening): the others are held
at zero. With ``sparse=True`` only the candidate weights are stored, a vector E long, and the encoder costs
O(B·E) instead of O(B·M²). The decoder then uses the identity Z(I − A)⁻¹ = f(X) at Z = μ_Z (exact, no M×M
solve); only a sampled Z goes through the solve. The acyclicity penalty still needs the M×M matrix.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from .acyclicity_penalty import acyclicity, support_blocks

__all__ = ["ElementwiseMLP", "VariationalNotears"]


def _elementwise_mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                     b2: torch.Tensor) -> torch.Tensor:
    """y_bj = x_bj + Σ_h w2_jh·silu(w1_jh·x_bj + b1_jh) + b2_j in one expression (what torch.compile fuses).

    The activation is laid out genes × hidden × batch so that the backward pass's three reductions over
    the batch (the weight gradients) run along contiguous memory (measured ~15 % faster than batch first).
    """
    hidden = torch.nn.functional.silu(torch.addcmul(b1.unsqueeze(-1), x.T.unsqueeze(1), w1.unsqueeze(-1)))
    return x + (hidden * w2.unsqueeze(-1)).sum(1).T + b2


def _solve(lhs: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.solve``; on CUDA without its check for a singular system, which would make the host wait for
    the device at every step (and cannot run inside a captured CUDA graph). A singular system then gives inf or NaN,
    which the trainer reports as a diverged fit at the end of the epoch."""
    if lhs.is_cuda:
        return torch.linalg.solve_ex(lhs, rhs, check_errors=False)[0]
    return torch.linalg.solve(lhs, rhs)


_compiled_mlp = None


def compiled_elementwise_mlp():
    """:func:`_elementwise_mlp` through ``torch.compile`` (built once per process, on first use)."""
    global _compiled_mlp
    if _compiled_mlp is None:
        # dynamic=True: one graph for every batch size and gene count. With shape specialisation each new
        # gene count costs two recompiles (encoder input without, decoder input with grad), and after
        # torch's recompile limit (8) a process fitting a few gene counts (the scaling benchmark) silently
        # ran the MLPs eagerly: 46 s per epoch at 2,000 genes instead of 15.
        _compiled_mlp = torch.compile(_elementwise_mlp, dynamic=True)
    return _compiled_mlp


class ElementwiseMLP(nn.Module):
    """M independent 1–H–1 MLPs with a skip connection: y_j = x_j + Σ_h w2_jh·silu(w1_jh·x_j + b1_jh) + b2_j.

    ``compiled = True`` evaluates it with :func:`compiled_elementwise_mlp`: the forward and backward passes
    over the (batch, genes, hidden) activation become a few fused loops instead of about a dozen eager
    kernels (forward + backward measured 2.6× faster at 128 × 1,000 × 64 on one CPU thread), the same
    function.
    """

    #: Evaluate with :func:`compiled_elementwise_mlp` (set by the trainer, see ``compile_mlp`` there).
    compiled: bool = False

    def __init__(self, n_genes: int, hidden: int = 64, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(n_genes, hidden, generator=generator))
        self.b1 = nn.Parameter(torch.randn(n_genes, hidden, generator=generator))
        # Small output weights: the module starts close to the identity.
        self.w2 = nn.Parameter(torch.randn(n_genes, hidden, generator=generator) * (0.1 / math.sqrt(max(hidden, 1))))
        self.b2 = nn.Parameter(torch.zeros(n_genes))

    #: Elements of the (batch, genes, hidden) activation processed at once. Gene chunks of about 1 MB stay
    #: in cache; one (128, 1000, 64) block is memory-bound and measured ~1.6× slower on CPU.
    chunk_elements = 1 << 18

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.compiled:
            # Views, not the Parameters: torch.compile holds a Parameter's shape static even with dynamic=True,
            # which made every new gene count a new graph (and past torch's recompile limit, eager kernels).
            return compiled_elementwise_mlp()(x, *(p.view_as(p) for p in (self.w1, self.b1, self.w2, self.b2)))
        n_genes, hidden = self.w1.shape
        step = max(1, self.chunk_elements // max(1, x.shape[0] * hidden))
        if x.device.type != "cpu" or step >= n_genes:
            return x + self._block(x, slice(None)) + self.b2
        parts = [self._block(x[:, s:s + step], slice(s, s + step)) for s in range(0, n_genes, step)]
        return x + torch.cat(parts, dim=1) + self.b2

    def _block(self, x: torch.Tensor, genes: slice) -> torch.Tensor:
        hidden = torch.nn.functional.silu(torch.addcmul(self.b1[genes], x.unsqueeze(-1), self.w1[genes]))
        return torch.einsum("bmh,mh->bm", hidden, self.w2[genes])


class VariationalNotears(nn.Module):
    """Variational nonlinear SEM with a learnt weighted adjacency A (dense, or A = UVᵀ of rank ``rank``).

    Parameters
    ----------
    n_genes
        Number of variables M.
    rank
        Rank r of A = UVᵀ, or ``None`` for a dense A with zero diagonal.
    hidden
        Hidden width of the element-wise encoder/decoder MLPs (paper: 64); 0 makes f and g the identity
        (plus a bias): the linear SEM, i.e. NOTEARS' least squares on the normalised data.
    seed
        Seed of the parameter initialisation.
    sample_latent
        Learn σ of q(Z|X) and sample Z in training (see module docstring); default: σ = 1, Z = μ_Z.
    feature_norm
        ``"gene"`` (default): per-gene batch normalisation (unit variance per gene); ``"data"``: per-gene
        normalisation times :attr:`feature_scale` (the trainer sets it to each gene's standard deviation in the
        standardised input).
    candidates
        Optional M×M boolean matrix (dense A only): the edges i → j A may use; the others stay exactly 0.
    sparse
        Store only the candidate weights (requires ``candidates``): same model, memory and encoder cost
        proportional to the number of candidates (see the module docstring).
    """

    def __init__(self, n_genes: int, rank: int | None = None, hidden: int = 64, seed: int = 0,
                 sample_latent: bool = False, feature_norm: str = "gene", candidates=None,
                 sparse: bool = False) -> None:
        super().__init__()
        if n_genes < 1:
            raise ValueError(f"n_genes must be ≥ 1, got {n_genes}")
        if rank is not None and not 1 <= rank < n_genes:
            raise ValueError(f"rank must be in [1, n_genes) or None for dense, got {rank} with {n_genes} genes")
        if candidates is not None and rank is not None:
            raise ValueError("candidates restrict a dense A only (rank=None)")
        if sparse and candidates is None:
            raise ValueError("sparse=True stores the candidate weights only: pass candidates")
        gen = torch.Generator().manual_seed(int(seed))
        self.n_genes = n_genes
        self.rank = rank
        self.encoder_mlp = ElementwiseMLP(n_genes, hidden, gen)
        self.decoder_mlp = ElementwiseMLP(n_genes, hidden, gen)
        if feature_norm not in {"gene", "data"}:
            raise ValueError(f"feature_norm must be 'gene' or 'data', got {feature_norm!r}")
        self.feature_norm = nn.BatchNorm1d(n_genes, affine=False)
        # "data": per-gene normalisation times the gene's scale in the (standardised) input, set with
        # set_feature_scale; f then keeps the input's relative scales but cannot shrink a gene away.
        self.register_buffer("feature_scale", torch.ones(n_genes))
        self.sample_latent = bool(sample_latent)
        # log σ² of q(Z|X): learnt when sampling, else fixed at 0 (σ = 1).
        logvar = torch.full((n_genes,), -2.0 if sample_latent else 0.0)
        if sample_latent:
            self.z_logvar = nn.Parameter(logvar)
        else:
            self.register_buffer("z_logvar", logvar)
        self.sparse = bool(sparse)
        allowed = None
        if candidates is not None:
            allowed = torch.as_tensor(np.asarray(candidates, dtype=bool))
            if allowed.shape != (n_genes, n_genes):
                raise ValueError(f"candidates must be genes × genes = {(n_genes, n_genes)}, "
                                 f"got {tuple(allowed.shape)}")
            allowed = allowed & ~torch.eye(n_genes, dtype=torch.bool)
        if self.sparse:
            parents, children = allowed.nonzero(as_tuple=True)
            self.register_buffer("edge_parent", parents)
            self.register_buffer("edge_child", children)
            self.edge_weight = nn.Parameter(torch.zeros(parents.numel()))
            # The support's connected components, concatenated (buffers follow the model's device): h and its
            # weights take one exponential per component.
            blocks = support_blocks(parents.numpy(), children.numpy(), n_genes)
            self.block_shapes = [tuple(b.shape) for b in blocks]
            self.register_buffer("block_genes", torch.cat([b.reshape(-1) for b in blocks]) if blocks else
                                 torch.zeros(0, dtype=torch.long), persistent=False)  # derived from the edges
        elif rank is None:
            self.weight = nn.Parameter(torch.zeros(n_genes, n_genes))
            off_diagonal = 1.0 - torch.eye(n_genes)
            self.register_buffer("off_diagonal", off_diagonal if allowed is None else off_diagonal * allowed)
        else:
            # U = V = 0 is a saddle point with zero gradient; start from small random factors instead.
            # Entries of UVᵀ then start at about 0.01 whatever r.
            scale = 0.1 / rank**0.25
            self.U = nn.Parameter(torch.randn(n_genes, rank, generator=gen) * scale)
            self.V = nn.Parameter(torch.randn(n_genes, rank, generator=gen) * scale)

    def set_feature_scale(self, scale: torch.Tensor) -> None:
        """Per-gene scale of f(X) after normalisation (``feature_norm="data"``: the input's gene scales)."""
        self.feature_scale.copy_(torch.as_tensor(scale, dtype=self.feature_scale.dtype))

    # --- the graph -------------------------------------------------------------------------------------
    def adjacency_parameters(self) -> list[nn.Parameter]:
        """The parameters that define A (the acyclicity penalty only acts on these)."""
        if self.sparse:
            return [self.edge_weight]
        return [self.weight] if self.rank is None else [self.U, self.V]

    def edge_index(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(parents, children) of the stored weights of a sparse A, else ``None``."""
        return (self.edge_parent, self.edge_child) if self.sparse else None

    def adjacency(self) -> torch.Tensor:
        """The dense M×M weighted adjacency A (A[i, j]: effect of gene i on gene j)."""
        if self.sparse:
            empty = self.edge_weight.new_zeros(self.n_genes, self.n_genes)
            return empty.index_put((self.edge_parent, self.edge_child), self.edge_weight)
        if self.rank is None:
            return self.weight * self.off_diagonal
        full = self.U @ self.V.T
        return full - torch.diag(full.diagonal())  # exactly zero diagonal

    def self_loops(self) -> torch.Tensor:
        """diag(UVᵀ) in O(M·r) (low rank only): the self-loops masked out of the SEM."""
        return (self.U * self.V).sum(1)

    def support_blocks(self) -> list[torch.Tensor] | None:
        """The connected components of a sparse A's support (:func:`~cape.causal.support_blocks`), else ``None``."""
        if not self.sparse:
            return None
        parts = torch.split(self.block_genes, [g * k for g, k in self.block_shapes])
        return [part.reshape(shape) for part, shape in zip(parts, self.block_shapes, strict=True)]

    def acyclicity_matrix(self) -> torch.Tensor:
        """The matrix whose acyclicity is penalised: A (dense) or UVᵀ including its diagonal (low rank)."""
        return self.adjacency() if self.rank is None else self.U @ self.V.T

    def acyclicity(self) -> torch.Tensor:
        """h(A) (float64 scalar), through the k×k identity when that is cheaper."""
        if self.rank is None:
            return acyclicity(self.adjacency(), blocks=self.support_blocks())
        return acyclicity(U=self.U, V=self.V)

    def l1(self) -> torch.Tensor:
        """‖A‖₁ (A has a zero diagonal)."""
        if self.sparse:
            return self.edge_weight.abs().sum()
        if self.rank is None:
            return self.adjacency().abs().sum()
        # ‖UVᵀ‖₁ − Σ|diag(UVᵀ)|: one M×M temporary per step instead of three (diag matrix, difference, abs).
        return (self.U @ self.V.T).abs().sum() - self.self_loops().abs().sum()

    # --- the SEM ---------------------------------------------------------------------------------------
    def features(self, x: torch.Tensor) -> torch.Tensor:
        """f(X): the encoder MLP's output, normalised per gene (times :attr:`feature_scale`)."""
        return self.feature_norm(self.encoder_mlp(x)) * self.feature_scale

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """μ_Z = f(X)(I − A) (low rank: f(X) − (f(X)U)Vᵀ + f(X)·diag(UVᵀ))."""
        return self._mix(self.features(x))

    def _mix(self, fx: torch.Tensor) -> torch.Tensor:
        """f(X)(I − A) from f(X)."""
        if self.sparse:  # column j gets Σ_i f(X)_i A_ij over j's candidate parents i
            messages = fx.index_select(1, self.edge_parent) * self.edge_weight
            return fx - fx.new_zeros(fx.shape).index_add(1, self.edge_child, messages)
        if self.rank is None:
            return fx - fx @ self.adjacency()
        return fx * (1.0 + self.self_loops()) - (fx @ self.U) @ self.V.T

    def propagate(self, z: torch.Tensor) -> torch.Tensor:
        """Z(I − A)⁻¹ (low rank, B = I + D: ZB⁻¹ + (ZB⁻¹U)(I_r − VᵀB⁻¹U)⁻¹VᵀB⁻¹)."""
        if self.rank is None:
            eye = torch.eye(self.n_genes, dtype=z.dtype, device=z.device)
            return _solve((eye - self.adjacency()).T, z.T).T
        inv_base = 1.0 / (1.0 + self.self_loops())  # B⁻¹ (diagonal)
        eye_r = torch.eye(self.rank, dtype=z.dtype, device=z.device)
        core = eye_r - self.V.T @ (inv_base[:, None] * self.U)  # r×r
        zb = z * inv_base  # ZB⁻¹
        return zb + _solve(core.T, (zb @ self.U).T).T @ (self.V.T * inv_base)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """X̂ = g(Z(I − A)⁻¹)."""
        return self.decoder_mlp(self.propagate(z))

    def forward(self, x: torch.Tensor, sample: bool | None = None,
                recon_rows: int | None = None, keep: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Per-cell −ELBO terms averaged over the batch: ``{"recon", "kl", "nelbo"}``.

        ``sample`` draws Z by reparameterisation (default: in training mode when ``sample_latent``);
        otherwise Z = μ_Z. ``recon_rows`` = k < batch size averages the reconstruction term over k cells
        drawn at random (torch's generator) instead of all: an unbiased estimate of the same mean at k/B
        of the decoder's cost. The KL term, the only one A enters, always uses every cell.

        ``keep`` (batch × genes, 1 or 0) leaves gene j's own terms out for the cells where it is 0: a gene
        intervened on in a cell (a knock-out) does not follow its structural equation there, so, as in SDCD
        and DCD-FG, its equation's likelihood is dropped for those cells while its value still enters its
        children's equations. Sums stay divided by the batch size (the scale of a per-cell loss).
        """
        if sample is None:
            sample = self.training and self.sample_latent
        fx = self.features(x)
        mu = self._mix(fx)
        logvar = self.z_logvar
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if sample else mu
        x_target, keep_recon = x, keep
        if recon_rows is not None and recon_rows < x.shape[0]:
            rows = torch.randperm(x.shape[0], device=x.device)[:max(1, int(recon_rows))]
            z, x_target, fx = z[rows], x[rows], fx[rows]
            keep_recon = None if keep is None else keep[rows]
        # Sparse A at Z = μ_Z: Z(I − A)⁻¹ = f(X) exactly, so the M×M solve is skipped.
        x_hat = self.decoder_mlp(fx) if self.sparse and not sample else self.decode(z)
        recon_terms = (x_target - x_hat).pow(2)
        kl_terms = mu.pow(2) + logvar.exp() - 1.0 - logvar
        if keep is not None:
            recon_terms, kl_terms = recon_terms * keep_recon, kl_terms * keep
        recon = 0.5 * recon_terms.sum(1).mean()
        kl = 0.5 * kl_terms.sum(1).mean()
        return {"recon": recon, "kl": kl, "nelbo": recon + kl}
