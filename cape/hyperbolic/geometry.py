"""Distances of the two geometries Step II can embed into: the hyperboloid (curvature −1) and Euclidean
space (the CAPE-w/o-hyperbolic ablation). Pairwise and matrix forms with gradients that stay finite at
coincident points (self-pairs sit on the diagonal of the exact loss)."""

from __future__ import annotations

import torch

from .poincare import lift_to_hyperboloid

# Below these floors the distance is treated as constant: d ≈ 1.4e-6 (hyperbolic) and 1e-9 (Euclidean).
_ACOSH_FLOOR = 1.0 + 1e-12
_SQ_FLOOR = 1e-18


class LorentzGeometry:
    """Hyperboloid model: points (…, d+1) with ⟨p, p⟩_L = −1, p₀ > 0."""

    name = "hyperbolic"

    @staticmethod
    def dist_matrix(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(N, M) matrix of arcosh(−⟨x_i, y_j⟩_L)."""
        neg_inner = x[:, :1] @ y[:, :1].T - x[:, 1:] @ y[:, 1:].T
        return torch.acosh(torch.clamp(neg_inner, min=_ACOSH_FLOOR))

    @staticmethod
    def dist(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Broadcast pairwise distance over leading axes."""
        neg_inner = x[..., 0] * y[..., 0] - (x[..., 1:] * y[..., 1:]).sum(-1)
        return torch.acosh(torch.clamp(neg_inner, min=_ACOSH_FLOOR))

    @staticmethod
    def dist0(x: torch.Tensor) -> torch.Tensor:
        """Distance to the origin (1, 0, …, 0): arcosh(p₀) (Eq. 14)."""
        return torch.acosh(torch.clamp(x[..., 0], min=_ACOSH_FLOOR))

    @staticmethod
    @torch.no_grad()
    def clip_radius_(x: torch.Tensor, max_radius: float) -> None:
        """Pull points farther than ``max_radius`` from the origin radially back onto that sphere and
        re-project every point exactly onto the hyperboloid (x₀ = √(1 + ‖x̃‖²)), in place."""
        spatial = x[..., 1:]
        norm = spatial.norm(dim=-1, keepdim=True)
        limit = torch.sinh(torch.tensor(float(max_radius), dtype=x.dtype, device=x.device))
        spatial = torch.where(norm > limit, spatial * (limit / norm.clamp_min(1e-300)), spatial)
        x.copy_(lift_to_hyperboloid(spatial))


class EuclideanGeometry:
    """Flat space R^d with the Euclidean distance (the ablation without hyperbolic geometry)."""

    name = "euclidean"

    @staticmethod
    def dist_matrix(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        sq = (x * x).sum(-1)[:, None] + (y * y).sum(-1)[None, :] - 2.0 * x @ y.T
        return torch.sqrt(torch.clamp(sq, min=_SQ_FLOOR))

    @staticmethod
    def dist(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(torch.clamp(((x - y) ** 2).sum(-1), min=_SQ_FLOOR))

    @staticmethod
    def dist0(x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(torch.clamp((x * x).sum(-1), min=_SQ_FLOOR))

    @staticmethod
    @torch.no_grad()
    def clip_radius_(x: torch.Tensor, max_radius: float) -> None:
        norm = x.norm(dim=-1, keepdim=True)
        x.copy_(torch.where(norm > max_radius, x * (max_radius / norm.clamp_min(1e-300)), x))


GEOMETRIES = {"hyperbolic": LorentzGeometry, "euclidean": EuclideanGeometry}
