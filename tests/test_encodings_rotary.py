"""Exact properties of the rotary family: RoPE, CAPE, GRAPE-M (research note §4.7 GR-4, GR-7, GR-14; CAPE Eq. 25)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cape.encodings as E
from cape import CapeInputError
from cape.encodings import GenePositions
from cape.encodings.cape import CapeRotation
from cape.encodings.rotary import apply_complex, apply_rotary, rotate_embedding

V = 10


def block_rotation(angles: torch.Tensor) -> torch.Tensor:
    """Dense block-diagonal R(φ) (2p × 2p) of Eq. 26, built entry by entry."""
    p = angles.shape[0]
    r = torch.zeros(2 * p, 2 * p, dtype=angles.dtype)
    for i, a in enumerate(angles):
        r[2 * i, 2 * i], r[2 * i, 2 * i + 1] = torch.cos(a), -torch.sin(a)
        r[2 * i + 1, 2 * i], r[2 * i + 1, 2 * i + 1] = torch.sin(a), torch.cos(a)
    return r


def cape_encoding(vectors: torch.Tensor, d_model: int = 32, n_heads: int = 4, **kw) -> E.PositionalEncoding:
    has = torch.ones(vectors.shape[0], dtype=torch.bool)
    has[0] = False
    pos = GenePositions(vectors=vectors, has_position=has)
    return E.get("cape", d_model=d_model, n_heads=n_heads, n_layers=1, vocab_size=vectors.shape[0],
                 positions=pos, **kw).double()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_apply_rotary_matches_dense_rotation(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, dtype=torch.float64, generator=g)
    a = torch.randn(3, dtype=torch.float64, generator=g) * 3
    torch.testing.assert_close(apply_rotary(x, a), block_rotation(a) @ x, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("dim", "layout"), [(4, "shared"), (16, "split"), (3, "shared"), (10, "split")])
def test_cape_relative_law_against_brute_force(dim, layout):
    """logit(m, n) = q_mᵀ R(φ_n − φ_m) k_n with φ = (π/4)·e, per head, for both layouts (Eq. 25)."""
    g = torch.Generator().manual_seed(dim)
    e = (torch.rand(V, dim, generator=g, dtype=torch.float64) - 0.5) * 1.8
    enc = cape_encoding(e)
    assert enc.rotation.layout == layout
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9]])
    q = torch.randn(1, 4, 9, 8, dtype=torch.float64, generator=g)
    k = torch.randn(1, 4, 9, 8, dtype=torch.float64, generator=g)
    ctx = enc.begin(ids, None)
    q2, k2 = enc.transform_qk(q, k, ctx, 0)
    logits = q2 @ k2.transpose(-1, -2)
    phi = math.pi / 4 * e.float().double()  # the encoding stores float32 angles
    total = 4 * 4 if layout == "split" else 4
    phi = torch.nn.functional.pad(phi, (0, total - dim))
    for h in range(4):
        cols = slice(4 * h, 4 * h + 4) if layout == "split" else slice(0, 4)
        for m in range(9):
            for n in range(9):
                delta = phi[ids[0, n], cols] - phi[ids[0, m], cols]
                want = q[0, h, m] @ block_rotation(delta) @ k[0, h, n]
                torch.testing.assert_close(logits[0, h, m, n], want, rtol=1e-6, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), shift=st.lists(st.floats(-2, 2), min_size=8, max_size=8))
def test_cape_logits_invariant_to_a_common_shift_of_e(seed, shift):
    g = torch.Generator().manual_seed(seed)
    e = (torch.rand(V, 8, generator=g, dtype=torch.float64) - 0.5)
    ids = torch.arange(1, V)[None]  # every token has a position
    q = torch.randn(1, 4, V - 1, 8, dtype=torch.float64, generator=g)
    k = torch.randn(1, 4, V - 1, 8, dtype=torch.float64, generator=g)

    def logits(vectors):
        enc = cape_encoding(vectors)
        q2, k2 = enc.transform_qk(q, k, enc.begin(ids, None), 0)
        return q2 @ k2.transpose(-1, -2)

    shifted = e + torch.tensor(shift, dtype=torch.float64)
    torch.testing.assert_close(logits(shifted), logits(e), rtol=1e-4, atol=1e-4)


def test_cape_identity_for_tokens_without_position_and_padding():
    e = torch.rand(V, 4, dtype=torch.float64)
    enc = cape_encoding(e)
    ids = torch.tensor([[0, 3, 5, 7]])  # id 0 has no position
    pad = torch.tensor([[False, False, False, True]])
    q = torch.randn(1, 4, 4, 8, dtype=torch.float64)
    q2, _ = enc.transform_qk(q, q, enc.begin(ids, pad), 0)
    assert torch.equal(q2[:, :, 0], q[:, :, 0]) and torch.equal(q2[:, :, 3], q[:, :, 3])
    assert not torch.allclose(q2[:, :, 1], q[:, :, 1])


def test_cape_input_mode_rotates_the_embedding_F108():
    e = torch.rand(V, 5, dtype=torch.float64) - 0.5
    enc = cape_encoding(e, mode="input")
    assert enc.provides == {"input"}
    ids = torch.tensor([[0, 2, 4]])
    x = torch.randn(1, 3, 32, dtype=torch.float64)
    y = enc.apply_input(x, enc.begin(ids, None))
    phi = torch.nn.functional.pad(math.pi / 4 * e.float().double(), (0, 16 - 5))
    torch.testing.assert_close(y[0, 1], block_rotation(phi[2]) @ x[0, 1])
    torch.testing.assert_close(y[0, 0], x[0, 0])  # no position: unchanged
    q = torch.randn(1, 4, 3, 8, dtype=torch.float64)
    assert enc.transform_qk(q, q, enc.begin(ids, None), 0)[0] is q
    with pytest.raises(CapeInputError):
        rotate_embedding(torch.zeros(1, 1, 4), torch.zeros(1, 1, 3))


def test_cape_rotation_module_and_precomputed_angles_agree():
    e = torch.rand(V, 4) - 0.5
    angles = math.pi / 4 * e
    from_e = cape_encoding(e.double())
    pos = GenePositions(vectors=angles, vectors_are_angles=True)
    from_angles = E.get("cape", d_model=32, n_heads=4, n_layers=1, vocab_size=V, positions=pos).double()
    ids = torch.tensor([[1, 2, 3]])
    q = torch.randn(1, 4, 3, 8, dtype=torch.float64)
    a = from_e.transform_qk(q, q, from_e.begin(ids, None), 0)[0]
    b = from_angles.transform_qk(q, q, from_angles.begin(ids, None), 0)[0]
    torch.testing.assert_close(a, b)
    rot = CapeRotation(n_heads=4, head_dim=8, dim=4)
    torch.testing.assert_close(rot(q, angles[ids].double()), b)


def test_rope_relative_law_on_real_valued_order():
    order = torch.tensor([0.0, 3.5, 1.25, 7.0, 2.0, 9.5])
    pos = GenePositions(order=order)
    enc = E.get("rope", d_model=16, n_heads=2, n_layers=1, vocab_size=6, positions=pos).double()
    shifted = E.get("rope", d_model=16, n_heads=2, n_layers=1, vocab_size=6,
                    positions=GenePositions(order=order + 11.0)).double()
    ids = torch.arange(6)[None]
    q, k = torch.randn(2, 1, 2, 6, 8, dtype=torch.float64).unbind(0)
    a = enc.transform_qk(q, k, enc.begin(ids, None), 0)
    b = shifted.transform_qk(q, k, shifted.begin(ids, None), 0)
    torch.testing.assert_close(a[0] @ a[1].transpose(-1, -2), b[0] @ b[1].transpose(-1, -2))
    theta = 10_000.0 ** (-torch.arange(4, dtype=torch.float64) / 4)
    for m in range(6):
        for n in range(6):
            want = q[0, 0, m] @ block_rotation((order[n] - order[m]).double() * theta) @ k[0, 0, n]
            torch.testing.assert_close((a[0] @ a[1].transpose(-1, -2))[0, 0, m, n], want)


def test_grape_m_canonical_planes_equal_rope():
    order = torch.randperm(V).float()
    pos = GenePositions(order=order)
    rope = E.get("rope", d_model=32, n_heads=4, n_layers=1, vocab_size=V, positions=pos)
    grape = E.get("grape_m", d_model=32, n_heads=4, n_layers=1, vocab_size=V, positions=pos, source="order",
                  learn_basis=False)
    ids = torch.randint(0, V, (2, 7))
    q, k = torch.randn(2, 2, 4, 7, 8).unbind(0)
    a = rope.transform_qk(q, k, rope.begin(ids, None), 0)
    b = grape.transform_qk(q, k, grape.begin(ids, None), 0)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("dim", "layout"), [(4, "shared"), (16, "split")])
def test_grape_m_default_init_is_cape_with_the_same_layout(dim, layout):
    """d_pos = head_dim/2 (shared) or n_heads·head_dim/2 (split, the paper's D/2): GRAPE-M at init is CAPE."""
    e = torch.rand(V, dim) - 0.5
    pos = GenePositions(vectors=e)
    cape = E.get("cape", d_model=32, n_heads=4, n_layers=1, vocab_size=V, positions=pos)
    grape = E.get("grape_m", d_model=32, n_heads=4, n_layers=1, vocab_size=V, positions=pos)
    assert cape.rotation.layout == grape.layout == layout
    assert grape.frequencies.shape == (4, 4, dim)
    # every coordinate is read by exactly one plane (of one head, or of every head when shared)
    used = (grape.frequencies != 0).any(dim=(0, 1))
    assert used.all()
    ids = torch.arange(V)[None]
    q, k = torch.randn(2, 1, 4, V, 8).unbind(0)
    a = cape.transform_qk(q, k, cape.begin(ids, None), 0)
    b = grape.transform_qk(q, k, grape.begin(ids, None), 0)  # basis = I at init
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_grape_m_initial_frequencies_follow_the_global_plane_index():
    """Plane c = h·p + k (split) or k (shared) reads coordinate c mod d_pos at frequency (π/4)·2^(−⌊c/d_pos⌋)."""
    for dim, layout in [(6, "split"), (3, "shared"), (16, "split"), (3, "split")]:
        pos = GenePositions(vectors=torch.rand(V, dim) - 0.5)
        w = E.get("grape_m", d_model=32, n_heads=4, n_layers=1, vocab_size=V, positions=pos, layout=layout,
                  learn_basis=False).frequencies.detach()
        for h in range(4):
            for k in range(4):
                c = 4 * h + k if layout == "split" else k
                want = torch.zeros(dim)
                want[c % dim] = math.pi / 4 * 2.0 ** (-(c // dim))
                torch.testing.assert_close(w[h, k], want)
    with pytest.raises(CapeInputError, match="scalar position"):
        E.get("grape_m", d_model=32, n_heads=4, n_layers=1, vocab_size=V,
              positions=GenePositions(order=torch.arange(V).float()), layout="split")
    with pytest.raises(CapeInputError, match="unknown rotary layout"):
        E.get("grape_m", d_model=32, n_heads=4, n_layers=1, vocab_size=V, positions=pos, layout="diagonal")


@pytest.mark.parametrize("source", ["vectors", "order"])
def test_grape_m_loads_a_state_dict_with_shared_frequencies(source):
    """Models saved before W was per head stored it as (p, d_pos): it loads, shared by every head, same output."""
    g = torch.Generator().manual_seed(7)
    pos = GenePositions(vectors=torch.rand(V, 4, generator=g) - 0.5, order=torch.randperm(V, generator=g).float())

    def build():
        return E.get("grape_m", d_model=32, n_heads=4, n_layers=1, vocab_size=V, positions=pos, source=source).double()

    old = build()
    with torch.no_grad():
        old.basis_generator.normal_(generator=g)
    shared = torch.randn(old.frequencies.shape[1:], generator=g, dtype=torch.float64)  # the old (p, d_pos)
    state = old.state_dict()
    state["frequencies"] = shared
    with torch.no_grad():
        old.frequencies.copy_(shared.expand_as(old.frequencies))
    ids = torch.randint(0, V, (2, 7), generator=g)
    q, k = torch.randn(2, 2, 4, 7, 8, generator=g, dtype=torch.float64).unbind(0)
    # the old forward: one (B, 1, L, p) rotation, θ = x Wᵀ with W (p, d_pos), broadcast over heads
    ctx = old.begin(ids, None)
    x = old.position_table[ids] * ctx.has_position[..., None].double()
    angles = (x @ shared.t())[:, None]
    z = torch.polar(torch.ones_like(angles), angles)
    basis = old.basis()[None]
    want = apply_complex(q @ basis, z), apply_complex(k @ basis, z)
    new = build()
    new.load_state_dict(state)
    assert new.frequencies.shape == (4, 4, old.frequencies.shape[-1])
    got = new.transform_qk(q, k, new.begin(ids, None), 0)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, old.transform_qk(q, k, old.begin(ids, None), 0), rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="size mismatch"):  # other shapes still fail loudly
        build().load_state_dict({**state, "frequencies": torch.zeros(3, 3)})


@pytest.mark.parametrize("dim", [4, 16])
def test_grape_m_learned_frequencies_and_basis_keep_translation_invariance(dim):
    e = torch.rand(V, dim) - 0.5
    pos = GenePositions(vectors=e)
    ids = torch.arange(V)[None]
    q, k = torch.randn(2, 1, 4, V, 8).unbind(0)
    g = torch.Generator().manual_seed(5)

    def logits(vectors):
        enc = E.get("grape_m", d_model=32, n_heads=4, n_layers=1, vocab_size=V,
                    positions=GenePositions(vectors=vectors)).double()
        with torch.no_grad():
            enc.frequencies.copy_(torch.randn(enc.frequencies.shape, generator=torch.Generator().manual_seed(1)))
            enc.basis_generator.normal_(generator=torch.Generator().manual_seed(2))
        q2, k2 = enc.transform_qk(q.double(), k.double(), enc.begin(ids, None), 0)
        return q2 @ k2.transpose(-1, -2)

    t = torch.randn(dim, generator=g)
    torch.testing.assert_close(logits(e + t), logits(e), rtol=1e-4, atol=1e-4)
    basis = E.get("grape_m", d_model=32, n_heads=4, n_layers=1, vocab_size=V, positions=pos)
    with torch.no_grad():
        basis.basis_generator.normal_()
    b = basis.basis()
    torch.testing.assert_close(b @ b.transpose(-1, -2), torch.eye(8).expand(4, 8, 8), rtol=1e-5, atol=1e-5)
