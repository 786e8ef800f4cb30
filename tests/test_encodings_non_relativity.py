"""The Behind-RoPE non-relativity index (research note §2.4): 0 for relative patterns, ≈ 1 for unrelated ones."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import cape.encodings as E
from cape import CapeInputError
from cape.encodings import GenePositions
from cape.encodings.non_relativity import non_relativity, non_relativity_residual


def test_relative_scores_give_zero_and_unrelated_scores_give_about_one():
    p = torch.randperm(40, generator=torch.Generator().manual_seed(0)).double()
    rel = torch.sin(0.3 * (p[None, :] - p[:, None])) + 0.1 * (p[None, :] - p[:, None])
    assert non_relativity(rel, p) < 1e-12
    # affine invariance
    assert non_relativity(3 * rel + 7, p) < 1e-12
    noise = torch.randn(40, 40, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert 0.9 < non_relativity(noise, p) <= 1.0
    absolute = p[None, :].expand(40, 40) ** 2  # depends on the key's absolute position
    assert non_relativity(absolute, p) > 0.3


def test_rope_logits_with_shared_q_k_are_relative_but_an_absolute_encoding_is_not():
    """RoPE with the same q for every token: S_ij = qᵀR(θ(p_j − p_i))k → NRI = 0 over cells and heads."""
    length = 24
    order = torch.randperm(length, generator=torch.Generator().manual_seed(2)).float()
    enc = E.get("rope", d_model=32, n_heads=2, n_layers=1, vocab_size=length,
                positions=GenePositions(order=order)).double()
    ids = torch.arange(length)[None].expand(3, length)
    q = torch.randn(3, 2, 1, 16, dtype=torch.float64).expand(3, 2, length, 16)
    k = torch.randn(3, 2, 1, 16, dtype=torch.float64).expand(3, 2, length, 16)
    logits = enc.logits(q, k, enc.begin(ids, None), 0)
    assert non_relativity(logits, order) < 1e-10
    absolute = E.get("trainable_absolute", d_model=32, n_heads=2, n_layers=1, vocab_size=length).double()
    ctx = absolute.begin(ids, None)
    x = absolute.apply_input(torch.zeros(3, length, 32, dtype=torch.float64), ctx).view(3, length, 2, 16)
    x = x.transpose(1, 2)
    assert non_relativity(absolute.logits(x, x, ctx, 0), order) > 0.5


def test_vector_positions_poincare_bins_mask_and_bad_input():
    e = torch.rand(30, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 0.5
    d = torch.cdist(e, e)
    scores = torch.exp(-d)  # a function of the distance only
    nri = non_relativity(scores, e, bins=60)
    assert nri < 0.1  # quantile bins: small within-bin spread only
    assert non_relativity(scores, d, metric="pairwise", bins=60) == pytest.approx(nri)
    from cape.hyperbolic.poincare import pairwise_poincare_distance

    hyperbolic = torch.exp(-pairwise_poincare_distance(e, e))
    assert non_relativity(hyperbolic, e, metric="poincare", bins=60) < 0.1
    assert non_relativity(hyperbolic, e, metric="poincare", bins=60) < non_relativity(
        hyperbolic, torch.randn(30, 3, dtype=torch.float64), bins=60)
    mask = ~torch.eye(30, dtype=torch.bool)
    residual, _ = non_relativity_residual(scores, e, bins=60, mask=mask)
    assert torch.isnan(residual.diagonal()).all() and not torch.isnan(residual[mask]).any()
    with pytest.raises(CapeInputError, match="logits"):
        non_relativity(np.zeros((3, 4)), np.arange(3.0))
    with pytest.raises(CapeInputError, match="pairs"):
        non_relativity(np.zeros((3, 3)), np.arange(4.0))
    with pytest.raises(CapeInputError, match="unknown metric"):
        non_relativity(np.zeros((3, 3)), np.zeros((3, 2)), metric="cosine")
    assert math.isfinite(non_relativity(np.ones((3, 3)), np.arange(3.0)))
