"""Hyperboloid ↔ Poincaré ball (Supp. A.2.3, Eqs. A.22/A.23) and the distances of both models (curvature −1).

geoopt's ``lorentz_to_poincare`` narrows along the wrong axis for inputs with more than two dimensions, so the
maps are written here directly; they work on any leading batch shape.
"""

from __future__ import annotations

import torch


def minkowski_inner(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """⟨x, y⟩_L = −x₀y₀ + Σᵢ xᵢyᵢ over the last axis (Eq. 12)."""
    return (x[..., 1:] * y[..., 1:]).sum(-1) - x[..., 0] * y[..., 0]


def lorentz_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """d_l(x, y) = arcosh(−⟨x, y⟩_L) (Eq. A.7), broadcasting over leading axes."""
    return torch.acosh(torch.clamp(-minkowski_inner(x, y), min=1.0))


def lorentz_to_poincare(p: torch.Tensor) -> torch.Tensor:
    """f_d(p) = p[1:] / (p₀ + 1) (Eq. A.22): hyperboloid point (…, d+1) → unit-ball point (…, d)."""
    return p[..., 1:] / (p[..., :1] + 1.0)


def poincare_to_lorentz(e: torch.Tensor) -> torch.Tensor:
    """f_d⁻¹(e) = (1 + ‖e‖², 2e) / (1 − ‖e‖²) (Eq. A.23): unit-ball point (…, d) → hyperboloid (…, d+1)."""
    sq = (e * e).sum(-1, keepdim=True)
    return torch.cat([1.0 + sq, 2.0 * e], dim=-1) / (1.0 - sq)


def poincare_distance(e: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """d_p(e, f) = arcosh(1 + 2‖e − f‖² / ((1 − ‖e‖²)(1 − ‖f‖²))) (Eq. A.21)."""
    diff = ((e - f) ** 2).sum(-1)
    denom = (1.0 - (e * e).sum(-1)) * (1.0 - (f * f).sum(-1))
    return torch.acosh(1.0 + 2.0 * diff / denom)


def pairwise_poincare_distance(x: torch.Tensor, y: torch.Tensor, eps: float = 1e-9) -> torch.Tensor:
    """All pairs of :func:`poincare_distance`: (..., n, d) × (..., m, d) → (..., n, m), in float64, with the
    conformal factors clamped at ``eps`` for points on the boundary."""
    x, y = x.double(), y.double()
    sq = torch.cdist(x, y).pow(2)
    nx_ = (1 - x.pow(2).sum(-1)).clamp_min(eps)
    ny_ = (1 - y.pow(2).sum(-1)).clamp_min(eps)
    denom = nx_[..., :, None] * ny_[..., None, :]
    return torch.arccosh(1 + 2 * sq / denom)


def hyperboloid_residual(p: torch.Tensor) -> torch.Tensor:
    """|⟨p, p⟩_L + 1| per point: 0 on the hyperboloid."""
    return (minkowski_inner(p, p) + 1.0).abs()


def lift_to_hyperboloid(spatial: torch.Tensor) -> torch.Tensor:
    """The hyperboloid point with spatial part ``spatial``: x₀ = √(1 + ‖x̃‖²) (exact projection)."""
    x0 = torch.sqrt(1.0 + (spatial * spatial).sum(-1, keepdim=True))
    return torch.cat([x0, spatial], dim=-1)
