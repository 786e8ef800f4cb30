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
low rank, A = UVᵀ; then the encoder costs O(B·M·r) and the decoder uses Woodbury,
(I − UVᵀ)⁻¹ = I + U(I_r − VᵀU)⁻¹Vᵀ, so no M×M matrix is formed per cell. A low-rank A cannot mask its
diagonal; the acyclicity penalty drives it to zero (h counts self-loops) and post-processing drops it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .acyclicity import acyclicity

__all__ = ["ElementwiseMLP", "VariationalNotears"]


class ElementwiseMLP(nn.Module):
    """M independent 1–H–1 MLPs with a skip connection: y_j = x_j + Σ_h w2_jh·silu(w1_jh·x_j + b1_jh) + b2_j."""

    def __init__(self, n_genes: int, hidden: int = 64, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(n_genes, hidden, generator=generator))
        self.b1 = nn.Parameter(torch.randn(n_genes, hidden, generator=generator))
        # Small output weights: the module starts close to the identity.
        self.w2 = nn.Parameter(torch.randn(n_genes, hidden, generator=generator) * (0.1 / math.sqrt(hidden)))
        self.b2 = nn.Parameter(torch.zeros(n_genes))

    #: Elements of the (batch, genes, hidden) activation processed at once. Gene chunks of about 1 MB stay
    #: in cache; one (128, 1000, 64) block is memory-bound and measured ~1.6× slower on CPU.
    chunk_elements = 1 << 18

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n_genes, hidden = self.w1.shape
        step = max(1, self.chunk_elements // max(1, x.shape[0] * hidden))
        if x.device.type != "cpu" or step >= n_genes:
            return x + self._block(x, slice(None)) + self.b2
        parts = [self._block(x[:, s:s + step], slice(s, s + step)) for s in range(0, n_genes, step)]
        return x + torch.cat(parts, dim=1) + self.b2

    def _block(self, x: torch.Tensor, genes: slice) -> torch.Tensor:
        hidden = torch.nn.functional.silu(torch.addcmul(self.b1[genes], x.unsqueeze(-1), self.w1[genes]))
        return torch.einsum("bmh,mh->bm", hidden, self.w2[genes])


class GlobalScaleNorm(nn.Module):
    """Centre each gene and divide by one scale shared by all genes (running statistics in eval mode).

    Unlike per-gene batch normalisation it keeps the genes' relative scales, which carry information
    about the causal order in many SEMs, while still fixing the overall scale of f(X).
    """

    def __init__(self, n_genes: int, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.register_buffer("running_mean", torch.zeros(n_genes))
        self.register_buffer("running_scale", torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] > 1:
            mean = x.mean(0)
            centred = x - mean
            scale = centred.pow(2).mean().add(self.eps).sqrt()
            with torch.no_grad():
                self.running_mean.lerp_(mean.detach(), self.momentum)
                self.running_scale.lerp_(scale.detach(), self.momentum)
            return centred / scale
        return (x - self.running_mean) / self.running_scale


class VariationalNotears(nn.Module):
    """Variational nonlinear SEM with a learnt weighted adjacency A (dense, or A = UVᵀ of rank ``rank``).

    Parameters
    ----------
    n_genes
        Number of variables M.
    rank
        Rank r of A = UVᵀ, or ``None`` for a dense A with zero diagonal.
    hidden
        Hidden width of the element-wise encoder/decoder MLPs (paper: 64).
    seed
        Seed of the parameter initialisation.
    sample_latent
        Learn σ of q(Z|X) and sample Z in training (see module docstring); default: σ = 1, Z = μ_Z.
    feature_norm
        ``"gene"`` (default): per-gene batch normalisation (unit variance per gene); ``"global"``: centre
        f(X) per gene and divide by one shared scale (keeps relative scales; fewer edges recovered on our
        development seeds).
    """

    def __init__(self, n_genes: int, rank: int | None = None, hidden: int = 64, seed: int = 0,
                 sample_latent: bool = False, feature_norm: str = "gene") -> None:
        super().__init__()
        if n_genes < 1:
            raise ValueError(f"n_genes must be ≥ 1, got {n_genes}")
        if rank is not None and not 1 <= rank < n_genes:
            raise ValueError(f"rank must be in [1, n_genes) or None for dense, got {rank} with {n_genes} genes")
        gen = torch.Generator().manual_seed(int(seed))
        self.n_genes = n_genes
        self.rank = rank
        self.encoder_mlp = ElementwiseMLP(n_genes, hidden, gen)
        self.decoder_mlp = ElementwiseMLP(n_genes, hidden, gen)
        if feature_norm not in {"global", "gene"}:
            raise ValueError(f"feature_norm must be 'global' or 'gene', got {feature_norm!r}")
        self.feature_norm = (GlobalScaleNorm(n_genes) if feature_norm == "global"
                             else nn.BatchNorm1d(n_genes, affine=False))
        self.sample_latent = bool(sample_latent)
        # log σ² of q(Z|X): learnt when sampling, else fixed at 0 (σ = 1).
        logvar = torch.full((n_genes,), -2.0 if sample_latent else 0.0)
        if sample_latent:
            self.z_logvar = nn.Parameter(logvar)
        else:
            self.register_buffer("z_logvar", logvar)
        if rank is None:
            self.weight = nn.Parameter(torch.zeros(n_genes, n_genes))
            self.register_buffer("off_diagonal", 1.0 - torch.eye(n_genes))
        else:
            # U = V = 0 is a saddle point with zero gradient; start from small random factors instead.
            # Entries of UVᵀ then start at about 0.01 whatever r.
            scale = 0.1 / rank**0.25
            self.U = nn.Parameter(torch.randn(n_genes, rank, generator=gen) * scale)
            self.V = nn.Parameter(torch.randn(n_genes, rank, generator=gen) * scale)

    # --- the graph -------------------------------------------------------------------------------------
    def adjacency_parameters(self) -> list[nn.Parameter]:
        """The parameters that define A (the acyclicity penalty only acts on these)."""
        return [self.weight] if self.rank is None else [self.U, self.V]

    def adjacency(self) -> torch.Tensor:
        """The dense M×M weighted adjacency A (A[i, j]: effect of gene i on gene j)."""
        if self.rank is None:
            return self.weight * self.off_diagonal
        return self.U @ self.V.T

    def acyclicity(self) -> torch.Tensor:
        """h(A) (float64 scalar), through the k×k identity when that is cheaper."""
        if self.rank is None:
            return acyclicity(self.adjacency())
        return acyclicity(U=self.U, V=self.V)

    def l1(self) -> torch.Tensor:
        """‖A‖₁ (off-diagonal entries)."""
        A = self.adjacency()
        return A.abs().sum() - A.diagonal().abs().sum()

    # --- the SEM ---------------------------------------------------------------------------------------
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """μ_Z = f(X)(I − A)."""
        fx = self.feature_norm(self.encoder_mlp(x))
        if self.rank is None:
            return fx - fx @ self.adjacency()
        return fx - (fx @ self.U) @ self.V.T

    def propagate(self, z: torch.Tensor) -> torch.Tensor:
        """Z(I − A)⁻¹ (Woodbury for low rank: Z + (ZU)(I_r − VᵀU)⁻¹Vᵀ)."""
        if self.rank is None:
            eye = torch.eye(self.n_genes, dtype=z.dtype, device=z.device)
            return torch.linalg.solve((eye - self.adjacency()).T, z.T).T
        eye_r = torch.eye(self.rank, dtype=z.dtype, device=z.device)
        core = eye_r - self.V.T @ self.U  # r×r
        zu = z @ self.U  # B×r
        return z + torch.linalg.solve(core.T, zu.T).T @ self.V.T

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """X̂ = g(Z(I − A)⁻¹)."""
        return self.decoder_mlp(self.propagate(z))

    def forward(self, x: torch.Tensor, sample: bool | None = None) -> dict[str, torch.Tensor]:
        """Per-cell −ELBO terms averaged over the batch: ``{"recon", "kl", "nelbo"}``.

        ``sample`` draws Z by reparameterisation (default: in training mode when ``sample_latent``);
        otherwise Z = μ_Z.
        """
        if sample is None:
            sample = self.training and self.sample_latent
        mu = self.encode(x)
        logvar = self.z_logvar
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if sample else mu
        x_hat = self.decode(z)
        recon = 0.5 * (x - x_hat).pow(2).sum(1).mean()
        kl = 0.5 * (mu.pow(2) + logvar.exp() - 1.0 - logvar).sum(1).mean()
        return {"recon": recon, "kl": kl, "nelbo": recon + kl}
