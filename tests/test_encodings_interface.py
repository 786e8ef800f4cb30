"""The encoding interface: registry, bad input, every encoding's forward/backward, round trips, no L×L tensor."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import cape.encodings as E
from cape import CapeInputError
from cape.encodings import GenePositions

V, D, H, LAYERS = 12, 32, 4, 3


def positions(seed: int = 0, dim: int = 4) -> GenePositions:
    g = torch.Generator().manual_seed(seed)
    vectors = (torch.rand(V, dim, generator=g) - 0.5) * 0.6
    order = torch.randperm(V, generator=g).float()
    has = torch.ones(V, dtype=torch.bool)
    has[:2] = False  # entries 0, 1 play <pad>/<cls>
    dist = torch.cdist(vectors, vectors)
    return GenePositions(vectors=vectors, order=order, has_position=has, graph_distance=dist)


def build(name: str, **options) -> E.PositionalEncoding:
    torch.manual_seed(0)
    return E.get(name, d_model=D, n_heads=H, n_layers=LAYERS, vocab_size=V, positions=positions(), **options)


def run_encoder(enc: E.PositionalEncoding, ids: torch.Tensor, pad: torch.Tensor | None, seed: int = 1,
                values: torch.Tensor | None = None) -> torch.Tensor:
    """A minimal bidirectional encoder (random fixed weights) driven through the interface."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(V, D, generator=g)
    w = [torch.randn(D, 3 * D, generator=g) / D**0.5 for _ in range(LAYERS)]
    ctx = enc.begin(ids, pad, values=values)
    x = enc.apply_input(emb[ids], ctx)
    b, length, _ = x.shape
    for layer in range(LAYERS):
        q, k, v = (x @ w[layer]).view(b, length, 3, H, D // H).permute(2, 0, 3, 1, 4)
        out = enc.attention(q, k, v, ctx, layer)
        x = x + torch.tanh(out.transpose(1, 2).reshape(b, length, D))
        enc.after_layer(ctx, x, layer)
    return x


def test_available_and_unknown_name():
    names = E.available()
    assert {"none", "cape", "rope", "tape", "hope", "grape_m", "grape_a", "cape_additive"} <= set(names)
    with pytest.raises(CapeInputError, match="available: none, static_absolute"):
        E.get("alibi2", d_model=D, n_heads=H, n_layers=1, vocab_size=V)


@pytest.mark.parametrize(
    ("name", "key"),
    [("cape", "varm['cape_angles'] missing: run `cape encode` / cape.tl.rotary_encoding"),
     ("tape", "varm['cape_angles'] missing"),
     ("cape_additive", "varm['cape_poincare'] missing: run `cape embed`"),
     ("grape_m", "varm['cape_poincare'] missing"),
     ("rope", "varp['cape_dag'] missing: run `cape causal`"),
     ("hope", "varp['cape_dag'] missing"),
     ("trainable_relative", "varp['cape_dag'] missing"),
     ("grape_a", "varp['cape_dag'] missing"),
     ("static_absolute", "gene2vec")],
)
def test_missing_positions_name_key_and_step(name, key):
    with pytest.raises(CapeInputError) as err:
        E.get(name, d_model=D, n_heads=H, n_layers=1, vocab_size=V, positions=None)
    assert key in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["rope", "cape", "tape", "grape_m", "hope"])
def test_odd_head_dim_is_refused(name):
    with pytest.raises(CapeInputError, match="head_dim .* must be even"):
        E.get(name, d_model=12, n_heads=4, n_layers=1, vocab_size=V, positions=positions())


def test_other_bad_input():
    with pytest.raises(CapeInputError, match="unknown option"):
        build("cape", scael=1.0)
    with pytest.raises(CapeInputError, match="vocab_size"):
        E.get("cape", d_model=D, n_heads=H, n_layers=1, vocab_size=V + 1, positions=positions())
    with pytest.raises(CapeInputError, match="do not fit"):  # 40 coordinates > 4 heads × 4 planes
        E.get("cape", d_model=D, n_heads=H, n_layers=1, vocab_size=V, positions=positions(dim=40))
    with pytest.raises(CapeInputError, match="do not fit shared"):  # a shared layout holds d ≤ head_dim/2
        E.get("tape", d_model=D, n_heads=H, n_layers=2, vocab_size=V, positions=positions(dim=8), layout="shared")
    with pytest.raises(CapeInputError, match="do not fit split"):  # 20 coordinates > 4 heads × 4 planes
        E.get("tape", d_model=D, n_heads=H, n_layers=2, vocab_size=V, positions=positions(dim=20))
    with pytest.raises(CapeInputError, match="disagree"):
        GenePositions(vectors=torch.zeros(3, 2), order=torch.zeros(4))


def test_linear_attention_backbone_refuses_bias_and_explicit_logits():
    for name in ("grape_a", "trainable_relative", "hope"):
        with pytest.raises(CapeInputError, match="Performer"):
            build(name).check_backbone("scbert", linear_attention=True)
    for name in ("cape", "rope", "grape_m", "tape", "none", "trainable_absolute"):
        build(name).check_backbone("scbert", linear_attention=True)


@pytest.mark.parametrize("name", E.available())
def test_forward_backward_padding_and_state_dict_round_trip(name):
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7], [1, 8, 9, 10, 11, 0, 0]])
    pad = ids == 0
    values = torch.rand(ids.shape, generator=torch.Generator().manual_seed(3))
    options = {"order": "expression"} if name == "rope" else {}
    enc = build(name, **options)
    out = run_encoder(enc, ids, pad, values=values)
    assert out.shape == (2, 7, D) and torch.isfinite(out).all()
    params = [p for p in enc.parameters() if p.requires_grad]
    if params:
        out[~pad].square().sum().backward()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in params)
    # padding must not leak into real tokens
    ids2 = ids.clone()
    ids2[1, 5:] = 3
    out2 = run_encoder(enc, ids2, pad, values=values)
    torch.testing.assert_close(out2[~pad], out[~pad])
    # save/load: a fresh instance with a different seed reproduces the outputs after load_state_dict
    torch.manual_seed(123)
    fresh = E.get(name, d_model=D, n_heads=H, n_layers=LAYERS, vocab_size=V, positions=positions(), **options)
    fresh.load_state_dict(enc.state_dict())
    torch.testing.assert_close(run_encoder(fresh, ids, pad, values=values).detach(), out.detach())


def test_none_encoder_is_permutation_equivariant():
    enc = build("none")
    ids = torch.tensor([[2, 3, 4, 5, 6, 7, 8, 9]])
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    out = run_encoder(enc, ids, None)
    torch.testing.assert_close(run_encoder(enc, ids[:, perm], None), out[:, perm])


class _ShapeRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append((str(func), tuple(t.shape)))
        return out


@pytest.mark.parametrize("name", ["rope", "cape", "tape", "grape_m"])
def test_rotary_encodings_never_materialise_a_genes_by_genes_tensor(name):
    length = 37  # a size no other axis has
    ids = torch.randint(1, V, (2, length), generator=torch.Generator().manual_seed(0))
    enc = build(name)
    q = torch.randn(2, H, length, D // H, requires_grad=True)
    k = torch.randn(2, H, length, D // H, requires_grad=True)
    with _ShapeRecorder() as rec:
        ctx = enc.begin(ids, None)
        q2, k2 = enc.transform_qk(q, k, ctx, 0)
        (q2.sum() + k2.sum()).backward()
    assert rec.shapes, "no op recorded"
    square = [(f, s) for f, s in rec.shapes if sum(d == length for d in s) >= 2]
    assert not square, square
    # and the hook does catch an L×L tensor
    with _ShapeRecorder() as rec:
        q @ k.transpose(-1, -2)
    assert any(sum(d == length for d in s) >= 2 for _, s in rec.shapes)


@pytest.mark.parametrize("name", E.available())
def test_bfloat16_autocast_forward_is_finite(name):
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7], [1, 8, 9, 10, 11, 0, 0]])
    options = {"order": "expression"} if name == "rope" else {}
    enc = build(name, **options)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run_encoder(enc, ids, ids == 0, values=torch.rand(ids.shape))
    assert torch.isfinite(out.float()).all()


def test_gene_positions_defaults_and_numpy_input():
    import numpy as np

    vectors = np.array([[np.nan, np.nan], [0.1, 0.2], [0.3, -0.1]])
    pos = GenePositions(vectors=vectors, order=np.array([np.nan, 0.0, 1.0]))
    assert pos.has_position.tolist() == [False, True, True] and pos.vocab_size == 3 and pos.dim == 2
    enc = E.get("cape", d_model=8, n_heads=2, n_layers=1, vocab_size=3, positions=pos)
    assert torch.isfinite(enc.angle_table).all() and torch.all(enc.angle_table[0] == 0)
