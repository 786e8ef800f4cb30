"""Bias-type and explicit-logit encodings: GRAPE-A/ALiBi (GR-8, GR-13), HoPE (HOPE-1/4/7/9), Transformer-XL (F.110)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cape.encodings as E
from cape.encodings import GenePositions
from cape.encodings.grape_a import alibi_lift, alibi_slopes
from cape.encodings.hope import boost_planes, hope_symmetric_logits
from cape.hyperbolic.poincare import pairwise_poincare_distance


# -- GRAPE-A / ALiBi ------------------------------------------------------------------------------------------
def test_grape_a_recovers_alibi_exactly():
    length, heads = 9, 8
    pos = GenePositions(order=torch.arange(length).float())
    ids = torch.arange(length)[None]
    sym = E.get("grape_a", d_model=64, n_heads=heads, n_layers=1, vocab_size=length, positions=pos)
    bias = sym.attn_bias(sym.begin(ids, None), 0)[0]
    slopes = torch.tensor([2.0 ** (-8.0 * h / heads) for h in range(1, heads + 1)])
    i = torch.arange(length)
    want_sym = -slopes[:, None, None] * (i[:, None] - i[None, :]).abs().float()
    torch.testing.assert_close(bias, want_sym, rtol=0, atol=0)
    signed = E.get("grape_a", d_model=64, n_heads=heads, n_layers=1, vocab_size=length, positions=pos, signed=True)
    bias = signed.attn_bias(signed.begin(ids, None), 0)[0]
    causal = i[None, :] <= i[:, None]
    # on the causal part (j ≤ i) the signed form is the original decoder ALiBi −β(i − j)
    torch.testing.assert_close(bias[:, causal], want_sym[:, causal], rtol=0, atol=0)
    torch.testing.assert_close(alibi_slopes(heads), slopes)


def test_grape_a_homogeneous_lift_is_exact():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 3, 6, 5, dtype=torch.float64, generator=g).unbind(0)
    p = torch.randn(2, 6, dtype=torch.float64, generator=g) * 4
    beta = torch.rand(3, dtype=torch.float64, generator=g)
    qh, kh = alibi_lift(q, k, p, p, beta)
    want = q @ k.transpose(-1, -2) + beta[None, :, None, None] * (p[:, None, None, :] - p[:, None, :, None])
    torch.testing.assert_close(qh @ kh.transpose(-1, -2), want, rtol=1e-12, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_signed_bias_collapses_to_a_per_key_bias_without_mask(seed):
    g = torch.Generator().manual_seed(seed)
    order = torch.randn(7, generator=g, dtype=torch.float64)
    enc = E.get("grape_a", d_model=16, n_heads=2, n_layers=1, vocab_size=7,
                positions=GenePositions(order=order), signed=True).double()
    ids = torch.arange(7)[None]
    scores = torch.randn(1, 2, 7, 7, generator=g, dtype=torch.float64)
    bias = enc.attn_bias(enc.begin(ids, None), 0)
    per_key = enc.slopes()[None, :, None, None] * order.float().double()[None, None, None, :]
    torch.testing.assert_close(torch.softmax(scores + bias, -1), torch.softmax(scores + per_key, -1))


def test_grape_a_poincare_and_graph_distances():
    e = torch.tensor([[0.0, 0.0], [0.5, 0.0], [0.0, -0.3], [0.2, 0.2]], dtype=torch.float64)
    d = pairwise_poincare_distance(e, e)
    torch.testing.assert_close(d[0, 1], 2 * torch.atanh(torch.tensor(0.5, dtype=torch.float64)))
    torch.testing.assert_close(d, d.T)
    has = torch.tensor([True, True, True, False])
    enc = E.get("grape_a", d_model=16, n_heads=2, n_layers=1, vocab_size=4,
                positions=GenePositions(vectors=e, has_position=has), distance="poincare")
    bias = enc.attn_bias(enc.begin(torch.tensor([[0, 1, 3]]), None), 0)[0]
    torch.testing.assert_close(bias[:, 0, 1], -enc.slopes() * d[0, 1].float())
    assert torch.all(bias[:, 2] == 0) and torch.all(bias[:, :, 2] == 0)  # no position: zero bias
    dist = torch.arange(16.0).view(4, 4)
    enc = E.get("grape_a", d_model=16, n_heads=2, n_layers=1, vocab_size=4,
                positions=GenePositions(order=torch.zeros(4), graph_distance=dist), distance="graph")
    bias = enc.attn_bias(enc.begin(torch.tensor([[2, 1]]), None), 0)[0]
    torch.testing.assert_close(bias[1], -enc.slopes()[1] * torch.tensor([[10.0, 9.0], [6.0, 5.0]]))


# -- HoPE -----------------------------------------------------------------------------------------------------
def hope_direct(q, k, p, theta, damping):
    """Plane loop: e^{−θ'|Δ|} Σ_i [cosh(θ_iΔ)(q₁k₁ + q₂k₂) + sinh(θ_iΔ)(q₁k₂ + q₂k₁)] / √d."""
    delta = p[:, None, :, None] - p[:, None, None, :]
    total = 0
    for i, t in enumerate(theta):
        q1, q2 = q[..., 2 * i], q[..., 2 * i + 1]
        k1, k2 = k[..., 2 * i], k[..., 2 * i + 1]
        even = q1[..., :, None] * k1[..., None, :] + q2[..., :, None] * k2[..., None, :]
        odd = q1[..., :, None] * k2[..., None, :] + q2[..., :, None] * k1[..., None, :]
        total = total + torch.cosh(t * delta) * even + torch.sinh(t * delta) * odd
    return torch.exp(-damping[None, :, None, None] * delta.abs()) * total / math.sqrt(q.shape[-1])


def test_hope_symmetric_two_matmul_form_equals_plane_loop_and_obeys_the_envelope():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 3, 11, 8, dtype=torch.float64, generator=g).unbind(0)
    p = torch.rand(2, 11, dtype=torch.float64, generator=g) * 2 - 1
    theta = torch.tensor([3.0, 1.0, 0.3, 0.1], dtype=torch.float64)
    damping = torch.tensor([3.5, 4.0, 6.0], dtype=torch.float64)
    fast = hope_symmetric_logits(q, k, p, p, theta, damping)
    torch.testing.assert_close(fast, hope_direct(q, k, p, theta, damping), rtol=1e-12, atol=1e-12)
    delta = (p[:, None, :, None] - p[:, None, None, :]).abs()
    envelope = torch.exp(-delta * (damping[None, :, None, None] - theta.max())) * (
        q.norm(dim=-1)[..., :, None] * k.norm(dim=-1)[..., None, :]
    ) / math.sqrt(8)
    assert torch.all(fast.abs() <= envelope * (1 + 1e-12))
    # no-position limit (θ = θ' = 0): plain dot product
    plain = hope_symmetric_logits(q, k, p, p, torch.zeros(4, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(plain, q @ k.transpose(-1, -2) / math.sqrt(8))


def test_hope_encoding_plain_logits_for_tokens_without_position_and_finite_softmax():
    order = torch.linspace(0, 50, 8)
    has = torch.ones(8, dtype=torch.bool)
    has[0] = False
    enc = E.get("hope", d_model=32, n_heads=4, n_layers=1, vocab_size=8,
                positions=GenePositions(order=order, has_position=has))
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7]])
    q, k, v = torch.randn(3, 1, 4, 8, 8).unbind(0)
    ctx = enc.begin(ids, None)
    logits = enc.logits(q, k, ctx)
    plain = q @ k.transpose(-1, -2) / math.sqrt(8)
    torch.testing.assert_close(logits[..., 0, :], plain[..., 0, :])
    torch.testing.assert_close(logits[..., :, 0], plain[..., :, 0])
    torch.testing.assert_close(logits[..., 3, 3], plain[..., 3, 3])  # Δ = 0
    assert not torch.allclose(logits[..., 1:, 1:], plain[..., 1:, 1:])
    out = enc.attention(q.requires_grad_(), k, v, ctx, 0)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()


def test_hope_causal_variant_is_the_published_relative_law_with_causal_mask():
    order = torch.tensor([0.0, 2.0, 5.0, 9.0, 14.0])
    enc = E.get("hope", d_model=16, n_heads=2, n_layers=1, vocab_size=5,
                positions=GenePositions(order=order), variant="causal").double()
    ids = torch.tensor([[0, 1, 2, 3, 4]])
    q, k = torch.randn(2, 1, 2, 5, 8, dtype=torch.float64).unbind(0)
    ctx = enc.begin(ids, None)
    q2, k2 = enc.transform_qk(q, k, ctx, 0)
    logits = q2 @ k2.transpose(-1, -2)
    p = (order / 14.0).double()
    damping = enc.damping()
    for h in range(2):
        for m in range(5):
            for n in range(m + 1):
                delta = p[m] - p[n]
                want = torch.exp(-delta * damping[h]) * (q[0, h, m] @ boost_planes(k[0, h, n], enc.theta * delta))
                torch.testing.assert_close(logits[0, h, m, n], want)
    bias = enc.attn_bias(ctx, 0)[0, 0]
    assert torch.all(torch.isinf(bias.triu(1)[bias.triu(1) != 0])) and torch.all(bias.tril() == 0)


# -- Transformer-XL relative (F.110) -------------------------------------------------------------------------
def test_trainable_relative_bias_matches_F110_and_depends_on_relative_order_only():
    order = torch.tensor([0.0, 1.0, 4.0, 2.0, 9.0, 3.0])
    make = lambda o: E.get("trainable_relative", d_model=16, n_heads=2, n_layers=2, vocab_size=6,  # noqa: E731
                           positions=GenePositions(order=o), max_distance=3).double()
    torch.manual_seed(0)
    enc = make(order)
    with torch.no_grad():
        enc.content_bias.normal_()
        enc.position_bias.normal_()
    ids = torch.tensor([[0, 1, 2, 3, 4, 5]])
    q, k = torch.randn(2, 1, 2, 6, 8, dtype=torch.float64).unbind(0)
    ctx = enc.begin(ids, None)
    enc.transform_qk(q, k, ctx, 1)
    bias = enc.attn_bias(ctx, 1)
    w = enc.position_proj[1].weight
    for h in range(2):
        u, v = enc.content_bias[1, h], enc.position_bias[1, h]
        for m in range(6):
            for n in range(6):
                r = int(max(-3, min(3, order[n] - order[m])))
                rel = (w @ enc.sinusoids[r + 3]).view(2, 8)[h]
                want = (q[0, h, m] @ rel + u @ k[0, h, n] + v @ rel) / math.sqrt(8)
                torch.testing.assert_close(bias[0, h, m, n], want)
    shifted = make(order + 5.0)
    shifted.load_state_dict(enc.state_dict() | {"order_table": (order + 5.0).double()})
    ctx2 = shifted.begin(ids, None)
    shifted.transform_qk(q, k, ctx2, 1)
    torch.testing.assert_close(shifted.attn_bias(ctx2, 1), bias)


def test_trainable_relative_needs_transform_before_bias():
    enc = E.get("trainable_relative", d_model=16, n_heads=2, n_layers=1, vocab_size=3,
                positions=GenePositions(order=torch.zeros(3)))
    with pytest.raises(RuntimeError):
        enc.attn_bias(enc.begin(torch.zeros(1, 2, dtype=torch.long), None), 0)
