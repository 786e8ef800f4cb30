"""Backbones × every positional encoding: forward/backward, save/load, equivariance, FAVOR+, bad input.

The AnnData carries random stand-ins for the CAPE keys (see ``_models_data.py``): these tests check the model
plumbing, not the quality of Steps I–III.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _models_data import cape_adata, one_thread  # noqa: F401  (fixture)

import cape
import cape.encodings as E
from cape import CapeInputError
from cape.models import CellTransformer, GeneVocab, NetworkConfig, ScBERTBackbone, ScGPTBackbone, gene_positions
from cape.models.modules.self_attention import softmax_features
from cape.models.tokenize import collate_cells, pad_to_multiple

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


@pytest.mark.parametrize("integration", ["complement", "replace"])
@pytest.mark.parametrize("architecture", ["scgpt", "scbert"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_encoding_forward_backward_and_roundtrip(adata, tmp_path, architecture, encoding, integration):
    model = CellTransformer(adata, architecture, encoding, **SMALL, integration=integration, seed=1)
    # scBERT runs encodings that add to the logits with exact softmax attention (Performer has no logits).
    expected = "performer" if architecture == "scbert" and not _needs_logits(encoding) else "softmax"
    assert model.backbone.attention_kind == expected
    assert model.backbone.integration == integration
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
        # ... and so does padding every sequence further, as batches on CUDA are (pad_to_multiple)
        longer = pad_to_multiple(batch, batch["gene_ids"].shape[1] + 5, model.vocab.pad_id)
        padded = model.backbone(longer["gene_ids"], longer["masked_values"], longer["padding_mask"])
    keep = ~batch["padding_mask"]
    torch.testing.assert_close(ref[keep], alt[keep], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref[keep], padded[:, :keep.shape[1]][keep], rtol=1e-5, atol=1e-5)
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
    assert loaded.backbone.integration == integration


def _two_cells_same_values_other_genes(model: CellTransformer) -> torch.Tensor:
    """Hidden states of two cells expressing genes 1–4 and genes 5–8 of the vocabulary at the same values."""
    model.module.eval()
    genes = [i for i in range(len(model.vocab)) if i not in (model.vocab.pad_id, model.vocab.cls_id)]
    cls = model.vocab.cls_id
    gene_ids = torch.tensor([[cls, *genes[:4]], [cls, *genes[4:8]]])
    values = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]] * 2)
    with torch.no_grad():
        return model.backbone(gene_ids, values)


@pytest.mark.parametrize("architecture", ["scgpt", "scbert"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_complement_mode_tells_genes_apart_for_every_encoding(adata, architecture, encoding):
    """Two cells expressing different genes at equal values give different outputs (issue: scBERT + CAPE could
    not tell them apart when CAPE only rotated q/k)."""
    model = CellTransformer(adata, architecture, encoding, **SMALL, integration="complement", seed=2)
    out = _two_cells_same_values_other_genes(model)
    assert (out[0, 0] - out[1, 0]).abs().max() > 1e-3  # the <cls> (cell) states differ


def test_replace_mode_without_encoding_has_no_gene_identity(adata):
    """The paper's CAPE-null (Table 3): integration='replace' with no encoding cannot tell genes apart."""
    for architecture in ("scgpt", "scbert"):
        model = CellTransformer(adata, architecture, "none", **SMALL, integration="replace", seed=3)
        assert not model.backbone.use_gene_embedding and model.backbone.identity is None
        out = _two_cells_same_values_other_genes(model)
        torch.testing.assert_close(out[0], out[1], rtol=1e-5, atol=1e-5)


def test_replace_mode_cape_rotates_the_token_embedding_and_qk(adata):
    model = CellTransformer(adata, "scbert", "cape", **SMALL, integration="replace", seed=4)
    assert model.backbone.encoding.mode == "both"
    assert model.backbone.encoding.provides == {"input", "qk"}
    explicit = CellTransformer(adata, "scbert", "cape", **SMALL, integration="replace",
                               encoding_options={"mode": "attention"}, seed=4)
    assert explicit.backbone.encoding.mode == "attention"  # the user's own option wins


def test_unknown_integration_is_refused(adata):
    with pytest.raises(CapeInputError, match="integration must be one of"):
        CellTransformer(adata, "scgpt", "none", **SMALL, integration="fuse")


@pytest.mark.parametrize("backbone_cls", [ScGPTBackbone, ScBERTBackbone])
def test_no_encoding_is_permutation_equivariant_over_genes(backbone_cls):
    torch.manual_seed(0)
    network = NetworkConfig(d_model=16, n_heads=2, n_layers=2, dropout=0.0)
    if backbone_cls is ScBERTBackbone:
        network = NetworkConfig(d_model=16, n_heads=2, n_layers=2, dropout=0.0, gene_embedding=True,
                                integration="replace")  # a learnt identity to permute
    model = backbone_cls(30, 0, network=network, encoding="none").eval()
    gene_ids = torch.cat([torch.ones(3, 1, dtype=torch.long), torch.randint(2, 30, (3, 9))], dim=1)
    values = torch.cat([torch.zeros(3, 1), torch.randint(0, 6, (3, 9)).float()], dim=1)
    perm = torch.cat([torch.zeros(1, dtype=torch.long), 1 + torch.randperm(9)])
    with torch.no_grad():
        out = model(gene_ids, values)
        out_p = model(gene_ids[:, perm], values[:, perm])
    torch.testing.assert_close(out[:, perm], out_p, rtol=1e-4, atol=1e-5)


def test_favor_features_approximate_softmax_attention():
    from cape.models.modules.self_attention import orthogonal_gaussian

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
def test_scbert_runs_logit_encodings_with_exact_softmax(adata, encoding):
    from cape.models.modules.self_attention import PerformerSelfAttention, SelfAttention

    vocab = GeneVocab.from_genes(adata.var_names)
    replace = NetworkConfig(d_model=16, n_heads=2, integration="replace")
    model = ScBERTBackbone(len(vocab), vocab.pad_id, network=replace, encoding=encoding,
                           positions=gene_positions(adata, vocab, encoding))
    assert model.attention_kind == "softmax"
    assert all(isinstance(layer.self_attn, SelfAttention) for layer in model.layers)
    plain = ScBERTBackbone(len(vocab), vocab.pad_id, network=replace, encoding="none")
    assert plain.attention_kind == "performer"
    assert all(isinstance(layer.self_attn, PerformerSelfAttention) for layer in plain.layers)
    # Performer itself still refuses a logit bias rather than dropping it silently.
    ctx = model.encoding.begin(torch.tensor([[vocab.cls_id, 2, 3]]))
    with pytest.raises(CapeInputError, match="Performer cannot apply|call attention"):
        plain.layers[0].self_attn(torch.zeros(1, 3, 16), model.encoding, ctx, 0)


def test_scaled_expression_is_refused(adata):
    bad = adata.copy()
    bad.X = bad.X.toarray() - 1.0
    with pytest.raises(CapeInputError, match="negative"):
        CellTransformer(bad, "scgpt", "none", **SMALL)


def test_scgpt_attention_dropout_is_separate_and_saved():
    plain = ScGPTBackbone(10, 0, network=NetworkConfig(d_model=16, n_heads=2, n_layers=1, dropout=0.3))
    assert plain.layers[0].self_attn.dropout == 0.0  # fused SDPA kernel stays usable on CPU
    assert plain.config()["attention_dropout"] == 0.0
    small = NetworkConfig(d_model=16, n_heads=2, n_layers=1)
    dropped = ScGPTBackbone(10, 0, network=small, attention_dropout=0.2)
    assert dropped.layers[0].self_attn.dropout == 0.2 and dropped.config()["attention_dropout"] == 0.2
    with pytest.raises(CapeInputError, match="attention_dropout"):
        ScGPTBackbone(10, 0, network=small, attention_dropout=1.0)


@pytest.mark.parametrize("architecture", ["scgpt", "scbert"])
def test_every_encoding_runs_in_the_default_model_with_step_two_default_dim(architecture):
    """d = D/2 (CAPE Supp. F.4): Step II's default 32 coordinates in the default 64-wide, 4-head model, split one
    per rotation plane; every encoding builds and runs a forward pass (22 of 22 backbone × encoding pairs)."""
    adata = cape_adata(n_cells=12, dim=32)
    defaults = cape.models.NetworkConfig()
    assert (defaults.d_model, defaults.n_heads) == (64, 4)
    for encoding in ENCODINGS:
        model = CellTransformer(adata, architecture, encoding, max_len=16, seed=0)
        if encoding == "cape":
            assert model.backbone.encoding.rotation.layout == "split"
        if encoding == "tape":
            assert model.backbone.encoding.layout == "split"
        batch = _batch(model, adata, n=3)
        model.module.eval()
        with torch.no_grad():
            hidden = model.backbone(batch["gene_ids"], batch["masked_values"], batch["padding_mask"])
        assert hidden.shape[-1] == 64 and torch.isfinite(hidden).all(), encoding
