"""TAPE (research note §3.7): permutation and global-rotation equivariance, shift invariance, layer 1 = CAPE.

The invariance tests run in both layouts: shared (d = head_dim/2 = 4 coordinates, every head the same phases) and
split (d = n_heads·head_dim/2 = 16, or fewer: each head its own coordinates, per-head updates only)."""

from __future__ import annotations

import math

import pytest
import torch

import cape.encodings as E
from cape import CapeInputError
from cape.encodings import GenePositions

V, D, H, LAYERS = 9, 32, 4, 3
# (layout, number of position coordinates): shared fits head_dim/2 = 4, split up to H·head_dim/2 = 16
LAYOUTS = [("shared", 4), ("split", 16), ("split", 10)]


def tape(vectors: torch.Tensor, randomise: bool = True, **kw) -> E.PositionalEncoding:
    torch.manual_seed(0)
    enc = E.get("tape", d_model=D, n_heads=H, n_layers=LAYERS, vocab_size=V,
                positions=GenePositions(vectors=vectors), **kw).double()
    if randomise:  # move away from the zero initialisation so that the state really evolves
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in enc.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    return enc


def run(enc, ids, pad=None, phase: float | None = None, manual: bool = False):
    """Tiny encoder (fixed random weights, float64). Returns the hidden states and the final TAPE state."""
    g = torch.Generator().manual_seed(2)
    emb = torch.randn(V, D, generator=g, dtype=torch.float64)
    w = [torch.randn(D, 3 * D, generator=g, dtype=torch.float64) / D**0.5 for _ in range(LAYERS)]
    ctx = enc.begin(ids, pad)
    if phase is not None:  # global rotation of every plane of every token: z → z·e^{iα}
        re, im = ctx.state["re"], ctx.state["im"]
        c, s = math.cos(phase), math.sin(phase)
        ctx.state["re"], ctx.state["im"] = re * c - im * s, re * s + im * c
    x = emb[ids]
    b, length, _ = x.shape
    for layer in range(LAYERS):
        q, k, v = (x @ w[layer]).view(b, length, 3, H, D // H).permute(2, 0, 3, 1, 4)
        if manual:  # the backbone's own path: transform_qk + SDPA, TAPE recomputes its position attention
            q2, k2 = enc.transform_qk(q, k, ctx, layer)
            mask = E.attention_mask(pad, None, q.dtype)
            out = torch.nn.functional.scaled_dot_product_attention(q2, k2, v, attn_mask=mask)
        else:
            out = enc.attention(q, k, v, ctx, layer)
        x = x + torch.tanh(out.transpose(1, 2).reshape(b, length, D))
        enc.after_layer(ctx, x, layer)
    return x, ctx.state["re"], ctx.state["im"]


@pytest.mark.parametrize(("layout", "dim"), LAYOUTS)
def test_permutation_equivariance(layout, dim):
    e = torch.rand(V, dim, dtype=torch.float64) - 0.5
    enc = tape(e)
    assert enc.layout == layout
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(3))
    x, re, im = run(enc, ids)
    xp, rep, imp = run(enc, ids[:, perm])
    torch.testing.assert_close(xp, x[:, perm], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(rep, re[:, :, perm], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(imp, im[:, :, perm], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("layout", "dim"), LAYOUTS)
def test_global_rotation_equivariance(layout, dim):
    enc = tape(torch.rand(V, dim, dtype=torch.float64) - 0.5)
    assert enc.layout == layout
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    x, re, im = run(enc, ids)
    xr, rer, imr = run(enc, ids, phase=0.7)
    torch.testing.assert_close(xr, x, rtol=1e-9, atol=1e-9)
    c, s = math.cos(0.7), math.sin(0.7)
    torch.testing.assert_close(rer, re * c - im * s, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(imr, re * s + im * c, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("layout", "dim"), LAYOUTS)
def test_shift_invariance_after_several_layers_with_padding(layout, dim):
    g = torch.Generator().manual_seed(dim)
    e = (torch.rand(V, dim, dtype=torch.float64, generator=g) - 0.5) * 0.5
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8], [8, 7, 6, 5, 4, 0, 0, 0]])
    pad = torch.zeros(ids.shape, dtype=torch.bool)
    pad[1, 5:] = True
    shift = torch.randn(dim, dtype=torch.float64, generator=g) * 1.5
    enc = tape(e)
    assert enc.layout == layout
    x, re, im = run(enc, ids, pad)
    xs, _, _ = run(tape(e + shift), ids, pad)
    assert (re.pow(2) + im.pow(2) - 1).abs().max() > 0.1  # the state really was contextualised
    # the stored tables are float32, so agreement is to float32 round-off of the angles
    torch.testing.assert_close(xs[~pad], x[~pad], rtol=1e-5, atol=1e-5)
    assert (xs[~pad] - x[~pad]).abs().max() < 1e-5


@pytest.mark.parametrize(("layout", "dim"), LAYOUTS)
def test_first_layer_equals_cape_and_zero_init_equals_cape_everywhere(layout, dim):
    e = torch.rand(V, dim) - 0.5
    cape = E.get("cape", d_model=D, n_heads=H, n_layers=LAYERS, vocab_size=V,
                 positions=GenePositions(vectors=e), layout=layout).double()
    ids = torch.tensor([[1, 3, 5, 7, 2]])
    q, k = torch.randn(2, 1, H, 5, D // H, dtype=torch.float64).unbind(0)
    want = cape.transform_qk(q, k, cape.begin(ids, None), 0)
    randomised = tape(e.double(), layout=layout)
    assert randomised.layout == layout
    got = randomised.transform_qk(q, k, randomised.begin(ids, None), 0)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # zero-initialised contextualisation: the whole TAPE encoder equals the CAPE encoder
    x_tape, re, im = run(tape(e.double(), randomise=False, layout=layout), ids)
    x_cape = run_cape(cape, ids)
    torch.testing.assert_close(x_tape, x_cape, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(re.pow(2) + im.pow(2), torch.ones_like(re))


def run_cape(enc, ids):
    g = torch.Generator().manual_seed(2)
    emb = torch.randn(V, D, generator=g, dtype=torch.float64)
    w = [torch.randn(D, 3 * D, generator=g, dtype=torch.float64) / D**0.5 for _ in range(LAYERS)]
    ctx = enc.begin(ids, None)
    x = emb[ids]
    b, length, _ = x.shape
    for layer in range(LAYERS):
        q, k, v = (x @ w[layer]).view(b, length, 3, H, D // H).permute(2, 0, 3, 1, 4)
        x = x + torch.tanh(enc.attention(q, k, v, ctx, layer).transpose(1, 2).reshape(b, length, D))
    return x


@pytest.mark.parametrize(("layout", "dim"), LAYOUTS[:2])
def test_position_attention_is_the_token_softmax_applied_to_the_state(layout, dim):
    """TAPE-6: z̃ = softmax(q'k'ᵀ/√d + mask) z, via SDPA."""
    enc = tape(torch.rand(V, dim, dtype=torch.float64) - 0.5)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 0, 0]])
    pad = ids == 0
    ctx = enc.begin(ids, pad)
    q, k = torch.randn(2, 2, H, 6, D // H, dtype=torch.float64).unbind(0)
    q2, k2 = enc.transform_qk(q, k, ctx, 0)
    logits = q2 @ k2.transpose(-1, -2) / math.sqrt(D // H)
    weights = torch.softmax(logits.masked_fill(pad[:, None, None, :], float("-inf")), dim=-1)
    re, im = enc._position_attention(ctx, 0)
    torch.testing.assert_close(re, weights @ ctx.state["re"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(im, weights @ ctx.state["im"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("layout", "dim"), LAYOUTS[:2])
def test_backbone_sdpa_path_equals_attention_method(layout, dim):
    enc = tape(torch.rand(V, dim, dtype=torch.float64) - 0.5)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 0, 0]])
    pad = ids == 0
    fused = run(enc, ids, pad)
    manual = run(enc, ids, pad, manual=True)
    for a, b in zip(fused, manual, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_rope_initialisation_on_an_order():
    order = torch.arange(V).float() * 0.5
    enc = E.get("tape", d_model=D, n_heads=H, n_layers=2, vocab_size=V, positions=GenePositions(order=order),
                init="rope")
    rope = E.get("rope", d_model=D, n_heads=H, n_layers=2, vocab_size=V, positions=GenePositions(order=order))
    ids = torch.tensor([[0, 4, 8]])
    q = torch.randn(1, H, 3, D // H)
    torch.testing.assert_close(enc.transform_qk(q, q, enc.begin(ids, None), 0),
                               rope.transform_qk(q, q, rope.begin(ids, None), 0))


def test_split_layout_state_starts_from_each_heads_own_coordinates_and_updates_per_head():
    e = torch.rand(V, 16, dtype=torch.float64) - 0.5
    enc = tape(e)
    assert enc.head_mix.shape == (LAYERS - 1, H)  # W_post's diagonal only
    ids = torch.tensor([[1, 2, 3]])
    re, im = enc.state(enc.begin(ids, None))
    phi = math.pi / 4 * e.float().double()[ids[0]]  # (3, 16): head h reads coordinates 4h..4h+3
    for h in range(H):
        torch.testing.assert_close(re[0, h], phi[:, 4 * h: 4 * h + 4].cos())
        torch.testing.assert_close(im[0, h], phi[:, 4 * h: 4 * h + 4].sin())
    # one update, by hand: z_h ← (z_h + w_h z̃_h)·(1 + Σ_i down[h,i] up[h,i] ψ_i(x))
    ctx = enc.begin(ids, None)
    q, k = torch.randn(2, 1, H, 3, D // H, dtype=torch.float64).unbind(0)
    enc.transform_qk(q, k, ctx, 0)
    z = torch.complex(*enc.state(ctx))
    weights = torch.softmax(ctx.state["qk"][1] @ ctx.state["qk"][2].transpose(-1, -2) / math.sqrt(D // H), -1)
    hidden = torch.randn(1, 3, D, dtype=torch.float64)
    psi = torch.nn.functional.silu(enc.gate[0](hidden))
    gain = 1 + torch.einsum("bli,hi->bhl", psi, enc.down[0] * enc.up[0])[..., None]
    want = (z + enc.head_mix[0][None, :, None, None] * (weights.to(z.dtype) @ z)) * gain
    enc.after_layer(ctx, hidden, 0)
    torch.testing.assert_close(torch.complex(*enc.state(ctx)), want, rtol=1e-12, atol=1e-12)


def test_layout_option():
    e = torch.rand(V, 4, dtype=torch.float64) - 0.5
    split = tape(e, layout="split")  # 4 coordinates fill head 0 only; the other heads start unrotated
    assert split.layout == "split" and split.head_mix.shape == (LAYERS - 1, H)
    re, im = split.state(split.begin(torch.tensor([[1, 2]]), None))
    assert torch.equal(re[:, 1:], torch.ones_like(re[:, 1:])) and torch.equal(im[:, 1:], torch.zeros_like(im[:, 1:]))
    assert not torch.equal(im[:, 0], torch.zeros_like(im[:, 0]))
    assert tape(e).layout == "shared" and tape(e).head_mix.shape == (LAYERS - 1, H, H)
    with pytest.raises(CapeInputError, match="do not fit shared"):
        tape(torch.rand(V, 5, dtype=torch.float64), layout="shared")
    with pytest.raises(CapeInputError, match="do not fit split"):
        tape(torch.rand(V, 17, dtype=torch.float64))
    with pytest.raises(CapeInputError, match="unknown rotary layout"):
        tape(e, layout="diagonal")
    order = GenePositions(order=torch.arange(V).float())
    with pytest.raises(CapeInputError, match="init='rope'"):
        E.get("tape", d_model=D, n_heads=H, n_layers=2, vocab_size=V, positions=order, init="rope", layout="split")
