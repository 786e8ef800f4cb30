"""Behind-RoPE's non-relativity diagnostic, generalised to genes.

For a sequence, Behind RoPE subtracts from every attention score the mean of its diagonal (constant i − j);
what remains is the part of the attention pattern that is *not* a function of the relative position. Genes
have no integer offsets, so the diagonals become bins of the relative key: binned p_j − p_i for a scalar
order, binned ‖e_j − e_i‖ or Poincaré distance for vectors, or any pairwise matrix the caller supplies. The
index is

    NRI = RMS(S − mean_bin(S)) / std(S)

over the included pairs: 0 when the scores depend on the relative key only, about 1 when they are unrelated to
it. It is invariant to adding a constant to S and to scaling S. Report it per layer on mean logits over cells.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .._errors import CapeInputError
from ..hyperbolic.poincare import pairwise_poincare_distance


def relative_keys(positions: Tensor | np.ndarray, metric: str = "auto") -> Tensor:
    """Pairwise relative key (L, L) from positions.

    ``positions``: (L,) scalars → signed offset p_j − p_i; (L, d) vectors → ``metric`` ``"euclidean"``
    (‖e_j − e_i‖, default for vectors) or ``"poincare"`` (d_P); an (L, L) matrix is returned as is when
    ``metric="pairwise"``.
    """

    p = torch.as_tensor(positions).detach().to(torch.float64)
    if metric == "pairwise":
        if p.ndim != 2 or p.shape[0] != p.shape[1]:
            raise CapeInputError(f"metric='pairwise' needs an (L, L) matrix, got shape {tuple(p.shape)}")
        return p
    if p.ndim == 1:
        if metric not in ("auto", "offset"):
            raise CapeInputError(f"scalar positions take metric 'offset', got '{metric}'")
        return p[None, :] - p[:, None]
    if p.ndim != 2:
        raise CapeInputError(f"positions must be (L,) or (L, d), got shape {tuple(p.shape)}")
    if metric in ("auto", "euclidean"):
        return torch.cdist(p, p)
    if metric == "poincare":

        return pairwise_poincare_distance(p, p)
    raise CapeInputError(f"unknown metric '{metric}' (use 'offset', 'euclidean', 'poincare' or 'pairwise')")


def _bin(keys: Tensor, bins: int | None) -> Tensor:
    """Integer bin per pair: exact values when few are distinct (integer offsets), else quantile bins."""

    flat = keys.flatten()
    distinct = torch.unique(flat)
    if bins is None and distinct.numel() <= 4 * keys.shape[0]:  # e.g. 2L − 1 integer offsets
        return torch.searchsorted(distinct, flat).view(keys.shape)
    n = bins or 32
    edges = torch.from_numpy(np.quantile(flat.numpy(), np.linspace(0, 1, n + 1)[1:-1]))
    return torch.bucketize(flat, edges).view(keys.shape)


def non_relativity_residual(logits: Tensor | np.ndarray, positions: Tensor | np.ndarray, *,
                            metric: str = "auto", bins: int | None = None,
                            mask: Tensor | np.ndarray | None = None) -> tuple[Tensor, Tensor]:
    """Scores minus their bin means, and the bin of every pair.

    ``logits``: (..., L, L), averaged over the leading axes (cells, heads) first. ``mask``: (L, L) bool of
    pairs to include (default: all). Excluded pairs get residual NaN.
    """

    s = torch.as_tensor(logits).detach().to(torch.float64)
    if s.ndim < 2 or s.shape[-1] != s.shape[-2]:
        raise CapeInputError(f"logits must be (..., L, L), got shape {tuple(s.shape)}")
    s = s.reshape(-1, *s.shape[-2:]).mean(0)
    keys = relative_keys(positions, metric)
    if keys.shape != s.shape:
        raise CapeInputError(f"positions give {tuple(keys.shape)} pairs but logits are {tuple(s.shape)}")
    if mask is None:
        include = torch.ones_like(s, dtype=torch.bool)
    else:
        include = torch.as_tensor(mask, dtype=torch.bool)
    binned = _bin(keys, bins)
    n_bins = int(binned.max()) + 1
    sums = torch.zeros(n_bins, dtype=s.dtype).index_add_(0, binned[include], s[include])
    counts = torch.zeros(n_bins, dtype=s.dtype).index_add_(0, binned[include], torch.ones_like(s[include]))
    means = sums / counts.clamp_min(1)
    residual = torch.where(include, s - means[binned], torch.full_like(s, float("nan")))
    return residual, binned


def non_relativity(logits: Tensor | np.ndarray, positions: Tensor | np.ndarray, *, metric: str = "auto",
                   bins: int | None = None, mask: Tensor | np.ndarray | None = None) -> float:
    """Non-relativity index NRI = RMS(S − mean_bin(S)) / std(S) of the (mean) logits S (0 = purely relative).

    Parameters
    ----------
    logits
        (..., L, L) attention logits of one layer (e.g. cells × heads × genes × genes); the leading axes are
        averaged first, as Behind RoPE averages over sequences and heads.
    positions
        (L,) scalar gene positions, (L, d) position vectors, or an (L, L) pairwise key with
        ``metric="pairwise"``.
    metric
        ``"offset"`` (scalars), ``"euclidean"``/``"poincare"`` (vectors) or ``"pairwise"``.
    bins
        Number of quantile bins; None uses exact values when there are few (integer offsets = diagonals).
    mask
        (L, L) bool pairs to include (e.g. exclude ``<cls>``, or the diagonal).
    """

    residual, _ = non_relativity_residual(logits, positions, metric=metric, bins=bins, mask=mask)
    s = torch.as_tensor(logits).detach().to(torch.float64)
    s = s.reshape(-1, *s.shape[-2:]).mean(0)
    included = ~torch.isnan(residual)
    spread = s[included].std(unbiased=False)
    if spread == 0:
        return 0.0
    return float(residual[included].pow(2).mean().sqrt() / spread)
