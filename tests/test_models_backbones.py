"""Backbones × every positional encoding: forward/backward, save/load, equivariance, FAVOR+, bad input.

The AnnData carries random stand-ins for the CAPE keys (see ``_models_data.py``): these tests check the model
plumbing, not the quality of Steps I–III.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _models_data import cape_adata, one_thread  # noqa: F401  (fixture)

import cape.encodings as E
from cape import CapeInputError
from cape.models import CellTransformer, GeneVocab, ScBERTBackbone, ScGPTBackbone, gene_positions
from cape.models.attention import softmax_features
from cape.models.tokenize import collate_cells

ENCODINGS = E.available()
SMALL = dict(d_model=16, n_heads=2, n_layers=2, max_len=32, dropout=0.0)


def _needs_logits(name: str) -> bool:
    return bool(E.get_class(name).provides & {"bias", "attention"})


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def adata():
    return cape_adata()


def _batch(model: CellTransformer, adata, n: int = 6, mask_ratio: float = 0.2):
    data = model._dataset(adata, mask_ratio=mask_ratio)
    return collate_cells([data[i] for i in range(n)], pad_id=model.vocab.pad_id)


@pytest.mark.parametrize("architecture", ["scgpt", "scbert"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_encoding_forward_backward_and_roundtrip(adata, tmp_path, architecture, encoding):
    if architecture == "scbert" and _needs_logits(encoding):
        with pytest.raises(CapeInputError, match="cannot apply"):
            CellTransformer(adata, architecture, encoding, **SMALL)
        return
    model = CellTransformer(adata, architecture, encoding, **SMALL, seed=1)
    batch = _batch(model, adata)
    assert batch["padding_mask"].any()                       # the batch exercises key padding
    model.module.train()
    hidden = model.backbone(batch["gene_ids"], batch["masked_values"], batch["padding_mask"])
    assert hidden.shape == (*batch["gene_ids"].shape, 16)
    assert torch.isfinite(hidden).all()
    pred = model.expr_head(hidden)
    target = batch["values"].round().long().clamp(0, pred.shape[-1] - 1) if pred.ndim == 3 else batch["values"]
    loss = (torch.nn.functional.cross_entropy(pred[batch["mask"]], target[batch["mask"]]) if pred.ndim == 3
            else ((pred - target)[batch["mask"]] ** 2).mean())
    loss.backward()
    grads = [p.grad for p in model.backbone.parameters() if p.requires_grad]
    assert all(g is None or torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads if g is not None) > 0
    # Padding must not leak into real tokens: changing padded values leaves the outputs unchanged.
    model.module.eval()
    with torch.no_grad():
        ref = model.backbone(batch["gene_ids"], batch["masked_values"], batch["padding_mask"])
        noisy = batch["masked_values"].masked_fill(batch["padding_mask"], 3.0)
        alt = model.backbone(batch["gene_ids"], noisy, batch["padding_mask"])
    keep = ~batch["padding_mask"]
    torch.testing.assert_close(ref[keep], alt[keep], rtol=1e-5, atol=1e-5)
    # Save/load: perturb every parameter (so a load that silently re-initialised would differ), round trip.
    with torch.no_grad():
        for p in model.module.parameters():
            p.add_(0.05 * torch.randn_like(p))
        before = model.backbone(batch["gene_ids"], batch["masked_values"], batch["padding_mask"])
    model.save(tmp_path / "model")
    loaded = CellTransformer.load(tmp_path / "model", adata, device="cpu")
    loaded.module.eval()
    with torch.no_grad():
        after = loaded.backbone(batch["gene_ids"], batch["masked_values"], batch["padding_mask"])
    assert torch.equal(before, after)
    assert loaded.backbone.encoding_name == encoding and loaded.vocab == model.vocab


@pytest.mark.parametrize("backbone_cls", [ScGPTBackbone, ScBERTBackbone])
def test_no_encoding_is_permutation_equivariant_over_genes(backbone_cls):
    torch.manual_seed(0)
    kwargs = dict(d_model=16, n_heads=2, n_layers=2, dropout=0.0, encoding="none")
    if backbone_cls is ScBERTBackbone:
        kwargs["gene_embedding"] = True                      # give genes an identity to permute
    model = backbone_cls(30, 0, **kwargs).eval()
    gene_ids = torch.cat([torch.ones(3, 1, dtype=torch.long), torch.randint(2, 30, (3, 9))], dim=1)
    values = torch.cat([torch.zeros(3, 1), torch.randint(0, 6, (3, 9)).float()], dim=1)
    perm = torch.cat([torch.zeros(1, dtype=torch.long), 1 + torch.randperm(9)])
    with torch.no_grad():
        out = model(gene_ids, values)
        out_p = model(gene_ids[:, perm], values[:, perm])
    torch.testing.assert_close(out[:, perm], out_p, rtol=1e-4, atol=1e-5)


def test_favor_features_approximate_softmax_attention():
    from cape.models.attention import orthogonal_gaussian

    g = torch.Generator().manual_seed(0)
    q = 0.5 * torch.randn(1, 1, 20, 8, generator=g)
    k = 0.5 * torch.randn(1, 1, 20, 8, generator=g)
    v = torch.randn(1, 1, 20, 8, generator=g)
    w = orthogonal_gaussian(8192, 8, g)
    qf, kf = softmax_features(q, w, is_query=True), softmax_features(k, w, is_query=False)
    approx = (qf @ (kf.transpose(-1, -2) @ v)) / (qf @ kf.sum(-2).unsqueeze(-1))
    exact = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, dim=-1) @ v
    assert (approx - exact).abs().max() < 0.05
    # fewer features: a worse approximation (the estimator is unbiased, its variance falls with m)
    w_small = orthogonal_gaussian(16, 8, g)
    qs, ks = softmax_features(q, w_small, is_query=True), softmax_features(k, w_small, is_query=False)
    small = (qs @ (ks.transpose(-1, -2) @ v)) / (qs @ ks.sum(-2).unsqueeze(-1))
    assert (small - exact).abs().mean() > (approx - exact).abs().mean()


def test_performer_applies_the_qk_transform():
    adata = cape_adata()
    a = CellTransformer(adata, "scbert", "none", **SMALL, seed=3)
    b = CellTransformer(adata, "scbert", "cape", **SMALL, seed=3)
    b.module.load_state_dict(a.module.state_dict(), strict=False)
    batch = _batch(a, adata)
    a.module.eval()
    b.module.eval()
    with torch.no_grad():
        ha = a.backbone(batch["gene_ids"], batch["values"], batch["padding_mask"])
        hb = b.backbone(batch["gene_ids"], batch["values"], batch["padding_mask"])
    assert not torch.allclose(ha, hb, atol=1e-4)


def test_positions_from_anndata_align_with_vocabulary():
    adata = cape_adata()
    vocab = GeneVocab.from_genes(adata.var_names[::-1])     # a vocabulary in another order
    pos = gene_positions(adata, vocab, "cape")
    assert pos.vectors_are_angles and pos.vectors.shape == (len(vocab), 4)
    for gene in ("GENE0", "GENE7"):
        np.testing.assert_allclose(pos.vectors[vocab[gene]].numpy(),
                                   adata.varm["cape_angles"][adata.var_names.get_loc(gene)], rtol=1e-6)
    has = pos.has_position.numpy()
    assert not has[vocab.pad_id] and not has[vocab.cls_id]
    assert not has[vocab["GENE23"]] and has[vocab["GENE0"]]   # GENE23 is outside var["cape_used"]
    rope = gene_positions(adata, vocab, "rope")
    order = rope.order.numpy()
    dag = adata.varp["cape_dag"].toarray()
    for i, j in zip(*np.nonzero(dag), strict=True):                       # parents come before children
        assert order[vocab[f"GENE{i}"]] < order[vocab[f"GENE{j}"]]
    assert gene_positions(adata, vocab, "rope", encoding_options={"order": "expression"}) is None
    assert gene_positions(adata, vocab, "none") is None


def test_grape_a_graph_distance_runs(adata):
    model = CellTransformer(adata, "scgpt", "grape_a", encoding_options={"distance": "graph"}, **SMALL)
    batch = _batch(model, adata)
    assert torch.isfinite(model.backbone(batch["gene_ids"], batch["values"], batch["padding_mask"])).all()


def test_graph_distances_are_hops_on_the_dag_skeleton_of_the_vocabulary(adata, monkeypatch):
    import networkx as nx
    import scipy.sparse as sp

    import cape.models.positions as positions

    vocab = GeneVocab.from_genes(adata.var_names)
    table = positions.graph_distance_from_dag(adata, vocab)
    skeleton = nx.from_scipy_sparse_array(sp.csr_matrix(adata.varp["cape_dag"]) != 0)
    hops = dict(nx.all_pairs_shortest_path_length(skeleton))
    finite = [d for row in hops.values() for d in row.values()]
    far = max(finite) + 1
    ids = vocab.lookup(adata.var_names)
    for i in range(adata.n_vars):
        for j in range(adata.n_vars):
            assert table[ids[i], ids[j]] == hops[i].get(j, far)
    assert not table[[vocab.pad_id, vocab.cls_id]].any()
    monkeypatch.setattr(positions, "GRAPH_DISTANCE_MAX_TOKENS", 10)
    with pytest.raises(CapeInputError, match="at most 10.*vocabulary='used'"):
        positions.graph_distance_from_dag(adata, vocab, "grape_a")


# ------------------------------------------------------------------------------------------------ bad input
def test_unknown_encoding_lists_the_available_ones(adata):
    with pytest.raises(CapeInputError, match="unknown positional encoding 'alibi'.*cape.*grape_a"):
        CellTransformer(adata, "scgpt", "alibi", **SMALL)
    with pytest.raises(CapeInputError, match="unknown architecture"):
        CellTransformer(adata, "bert", "none", **SMALL)


@pytest.mark.parametrize(("encoding", "key", "step"), [("cape", "cape_angles", "cape encode"),
                                                       ("cape_additive", "cape_poincare", "cape embed"),
                                                       ("rope", "cape_dag", "cape causal")])
def test_missing_positions_key_names_key_and_step(encoding, key, step):
    adata = cape_adata()
    for store in (adata.varm, adata.varp):
        if key in store:
            del store[key]
    with pytest.raises(CapeInputError, match=rf"{key}.*{step}"):
        CellTransformer(adata, "scgpt", encoding, **SMALL)


def test_odd_head_dim_is_refused_for_rotary_encodings(adata):
    with pytest.raises(CapeInputError, match="head_dim.*even"):
        CellTransformer(adata, "scgpt", "cape", d_model=12, n_heads=4, max_len=12)
    with pytest.raises(CapeInputError, match="multiple of n_heads"):
        CellTransformer(adata, "scgpt", "none", d_model=10, n_heads=4, max_len=12)


@pytest.mark.parametrize("encoding", [e for e in ENCODINGS if _needs_logits(e)])
def test_scbert_refuses_logit_encodings(adata, encoding):
    with pytest.raises(CapeInputError, match=rf"'{encoding}'.*scbert.*cannot apply"):
        ScBERTBackbone(len(adata.var_names) + 2, 0, d_model=16, n_heads=2, encoding=encoding,
                       positions=gene_positions(adata, GeneVocab.from_genes(adata.var_names), encoding))


def test_scaled_expression_is_refused(adata):
    bad = adata.copy()
    bad.X = bad.X.toarray() - 1.0
    with pytest.raises(CapeInputError, match="negative"):
        CellTransformer(bad, "scgpt", "none", **SMALL)


def test_scgpt_attention_dropout_is_separate_and_saved():
    plain = ScGPTBackbone(10, 0, d_model=16, n_heads=2, n_layers=1, dropout=0.3)
    assert plain.layers[0].self_attn.dropout == 0.0  # fused SDPA kernel stays usable on CPU
    assert plain.config()["attention_dropout"] == 0.0
    dropped = ScGPTBackbone(10, 0, d_model=16, n_heads=2, n_layers=1, attention_dropout=0.2)
    assert dropped.layers[0].self_attn.dropout == 0.2 and dropped.config()["attention_dropout"] == 0.2
    with pytest.raises(CapeInputError, match="attention_dropout"):
        ScGPTBackbone(10, 0, d_model=16, n_heads=2, n_layers=1, attention_dropout=1.0)
