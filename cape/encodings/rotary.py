"""Rotations of adjacent coordinate planes, shared by rope, cape, tape and grape_m.

Plane i of a vector x of width 2p is (x[..., 2i], x[..., 2i+1]); it is rotated by angle[..., i]:

    x'_{2i}   = x_{2i} cos a − x_{2i+1} sin a
    x'_{2i+1} = x_{2i} sin a + x_{2i+1} cos a

so for rotated q_m = R(φ_m) q and k_n = R(φ_n) k the logit is q_mᵀ R(φ_n − φ_m) k_n (the relative law).
Everything here is per token (O(B·H·L·head_dim)); no genes×genes tensor is ever formed, so SDPA's fused
kernels stay usable.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._errors import CapeInputError


def apply_planes(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Apply the 2×2 block [[cos, −sin], [sin, cos]] to every adjacent plane of ``x``.

    ``cos``/``sin`` broadcast to (..., p) for x of shape (..., 2p). They need not satisfy cos² + sin² = 1
    (TAPE's scaled rotations use this).
    """
    x0 = x[..., 0::2]
    x1 = x[..., 1::2]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2)


_COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}


def plane_rotation(angles: Tensor) -> Tensor:
    """Unit complex numbers e^{i·angle}: the per-plane rotations in the form :func:`apply_complex` takes."""
    angles = angles if angles.dtype in _COMPLEX else angles.float()
    return torch.polar(torch.ones_like(angles), angles)


def apply_complex(x: Tensor, z: Tensor) -> Tensor:
    """Multiply every adjacent plane (x_{2i} + i·x_{2i+1}) of ``x`` (..., 2p) by the complex ``z`` (→ (..., p)).

    With |z| = 1 this is :func:`apply_rotary` with angle arg z; any z gives TAPE's scaled rotations. For float32/
    float64 it is one complex multiply on a view of x (one read and one write of x forward and backward, about
    half the time of the four strided real products); half precision falls back to the real formula.
    """
    if x.dtype in _COMPLEX:
        pairs = x.unflatten(-1, (-1, 2))
        try:
            xc = torch.view_as_complex(pairs)
        except RuntimeError:  # strides or offset not complex-aligned
            xc = torch.view_as_complex(pairs.contiguous())
        return torch.view_as_real(xc * z.to(_COMPLEX[x.dtype])).flatten(-2)
    return apply_planes(x, z.real.to(x.dtype), z.imag.to(x.dtype))


def apply_rotary(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate the adjacent planes of ``x`` (..., 2p) by ``angles`` (broadcastable to (..., p))."""
    if x.shape[-1] % 2:
        raise CapeInputError(f"rotary encodings need an even last dimension, got {x.shape[-1]}")
    angles = angles.to(x.dtype if x.dtype in _COMPLEX else torch.float32)
    return apply_complex(x, plane_rotation(angles))


def rope_frequencies(n_planes: int, base: float = 10_000.0, dtype: torch.dtype = torch.float32) -> Tensor:
    """RoPE's spectrum θ_i = base^(−2i/(2·n_planes)), i = 0..n_planes−1."""
    i = torch.arange(n_planes, dtype=torch.float64)
    return (base ** (-2.0 * i / (2 * n_planes))).to(dtype)


def layout_for(dim: int, n_heads: int, n_planes: int, layout: str = "auto") -> str:
    """Decide how ``dim`` per-gene angle coordinates map onto ``n_heads`` heads of ``n_planes`` planes each.

    * ``"split"``: the coordinates are split across heads — head h rotates its planes by coordinates
      h·p … (h+1)·p − 1 (needs dim ≤ n_heads·p; missing coordinates are zero-padded, i.e. unrotated planes).
    * ``"shared"``: every head rotates its planes by the same coordinates (needs dim ≤ p; zero-padded).
    * ``"auto"``: ``"shared"`` when dim ≤ p, else ``"split"`` when dim ≤ n_heads·p. The paper's two cases,
      d = n_heads·head_dim/2 (split) and d = head_dim/2 (shared), are the exact fits; any smaller d leaves the
      trailing planes unrotated (content-only channels, as in partial-rotary models), which keeps the
      relative law.
    More coordinates than planes is an error: re-embed with a smaller dimension or widen the heads.
    """
    if layout not in ("auto", "split", "shared"):
        raise CapeInputError(f"unknown rotary layout '{layout}' (use 'auto', 'split' or 'shared')")
    if layout == "auto":
        layout = "shared" if dim <= n_planes else "split"
    capacity = n_planes if layout == "shared" else n_heads * n_planes
    if dim > capacity:
        raise CapeInputError(
            f"{dim} position coordinates do not fit {layout} rotary planes: {n_heads} heads × "
            f"{n_planes} planes (head_dim/2) hold at most {capacity}; embed with dim ≤ {capacity} "
            "or use more/wider heads"
        )
    return layout


def angles_to_heads(angles: Tensor, n_heads: int, n_planes: int, layout: str) -> Tensor:
    """Per-token angles (B, L, d) → per-head plane angles (B, H, L, p); H = 1 (broadcast) if shared."""
    b, length, dim = angles.shape
    if layout == "shared":
        if dim < n_planes:
            angles = torch.nn.functional.pad(angles, (0, n_planes - dim))
        return angles[:, None]
    total = n_heads * n_planes
    if dim < total:
        angles = torch.nn.functional.pad(angles, (0, total - dim))
    return angles.view(b, length, n_heads, n_planes).transpose(1, 2)


def rotate_embedding(x: Tensor, angles: Tensor) -> Tensor:
    """Input mode (CAPE F.108): rotate token embeddings (B, L, D) by per-token angles (B, L, d ≤ D/2)."""
    planes = x.shape[-1] // 2
    if angles.shape[-1] > planes:
        raise CapeInputError(
            f"{angles.shape[-1]} position coordinates do not fit the {planes} planes of a "
            f"{x.shape[-1]}-wide embedding"
        )
    if angles.shape[-1] < planes:
        angles = torch.nn.functional.pad(angles, (0, planes - angles.shape[-1]))
    return apply_rotary(x, angles)


DEFAULT_CAPE_SCALE = math.pi / 4
