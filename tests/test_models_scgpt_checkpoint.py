"""Import of scGPT checkpoint directories (args.json, vocab.json, best_model.pt) in both attention layouts.

The checkpoint is written here by a small reference model with scGPT's module names and shapes (``encoder``,
``value_encoder``, ``transformer_encoder`` = ``nn.TransformerEncoder`` post-norm, ``decoder``, ``cls_decoder``);
the flash layout renames ``self_attn.in_proj_*`` to ``self_attn.Wqkv.*`` as flash-attention checkpoints do.
"""

from __future__ import annotations

import json

import pytest
import torch
from _models_data import one_thread  # noqa: F401  (fixture)
from torch import nn

from cape import CapeInputError
from cape.models import load_scgpt_checkpoint
from cape.models.modules.scgpt import ContinuousValueEncoder, GeneEncoder

D, H, D_HID, LAYERS = 16, 4, 24, 2
TOKENS = [f"G{i}" for i in range(10)] + ["<pad>", "<cls>", "<eoc>"]


pytestmark = pytest.mark.usefixtures("one_thread")


class _ReferenceScGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        pad = TOKENS.index("<pad>")
        self.encoder = GeneEncoder(len(TOKENS), D, pad)
        self.value_encoder = ContinuousValueEncoder(D, 0.0)
        layer = nn.TransformerEncoderLayer(D, H, D_HID, dropout=0.0, batch_first=True)
        self.transformer_encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.decoder = nn.Module()
        self.decoder.fc = nn.Sequential(nn.Linear(D, D), nn.LeakyReLU(), nn.Linear(D, D), nn.LeakyReLU(),
                                        nn.Linear(D, 1))
        self.cls_decoder = nn.Linear(D, 3)                   # an unrelated head: must be reported unused

    def forward(self, gene_ids, values, pad):
        x = self.encoder(gene_ids) + self.value_encoder(values)
        return self.transformer_encoder(x, src_key_padding_mask=pad)


def _write(tmp_path, layout: str):
    torch.manual_seed(0)
    ref = _ReferenceScGPT().eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))               # layer norms away from identity
    state = ref.state_dict()
    if layout == "Wqkv":
        state = {k.replace("self_attn.in_proj_weight", "self_attn.Wqkv.weight")
                  .replace("self_attn.in_proj_bias", "self_attn.Wqkv.bias"): v for k, v in state.items()}
    torch.save(state, tmp_path / "best_model.pt")
    (tmp_path / "args.json").write_text(json.dumps({"embsize": D, "nheads": H, "d_hid": D_HID, "nlayers": LAYERS,
                                                    "n_layers_cls": 3, "dropout": 0.2, "n_bins": 51,
                                                    "input_emb_style": "continuous"}))
    (tmp_path / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(TOKENS)}))
    return ref


@pytest.mark.parametrize("layout", ["in_proj", "Wqkv"])
def test_imported_backbone_reproduces_the_reference(tmp_path, layout):
    ref = _write(tmp_path, layout)
    imported = load_scgpt_checkpoint(tmp_path, dropout=0.0)
    assert imported.layout == layout
    assert imported.vocab.tokens == TOKENS and imported.vocab.pad_id == 10 and imported.vocab.cls_id == 11
    assert imported.unused == ["cls_decoder.weight", "cls_decoder.bias"]
    assert imported.decoder is not None
    model = imported.backbone.eval()
    gene_ids = torch.tensor([[11, 0, 3, 5, 7, 2], [11, 4, 9, 10, 10, 10]])
    values = torch.tensor([[0.0, 3, 50, 12, 1, 7], [0.0, 20, 5, -2, -2, -2]])
    pad = gene_ids == 10
    with torch.no_grad():
        expected = ref(gene_ids, values, pad)
        got = model(gene_ids, values, pad)
        torch.testing.assert_close(got[~pad], expected[~pad], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(imported.decoder(got), ref.decoder.fc(got).squeeze(-1))


def test_imported_backbone_takes_a_positional_encoding(tmp_path):
    from cape.encodings import GenePositions

    _write(tmp_path, "in_proj")
    order = torch.arange(len(TOKENS), dtype=torch.float32)
    order[10:] = float("nan")
    plain = load_scgpt_checkpoint(tmp_path, dropout=0.0).backbone.eval()
    rope = load_scgpt_checkpoint(tmp_path, dropout=0.0, encoding="rope",
                                 positions=GenePositions(order=order)).backbone.eval()
    gene_ids = torch.tensor([[11, 0, 3, 5]])
    values = torch.tensor([[0.0, 3, 5, 1]])
    with torch.no_grad():
        assert not torch.allclose(plain(gene_ids, values), rope(gene_ids, values), atol=1e-4)


def test_bad_checkpoints(tmp_path):
    with pytest.raises(CapeInputError, match="lacks args.json"):
        load_scgpt_checkpoint(tmp_path)
    _write(tmp_path, "in_proj")
    args = json.loads((tmp_path / "args.json").read_text())
    (tmp_path / "args.json").write_text(json.dumps({**args, "embsize": 32}))
    with pytest.raises(CapeInputError, match="shape"):
        load_scgpt_checkpoint(tmp_path)
    (tmp_path / "args.json").write_text(json.dumps({**args, "nlayers": 3}))
    with pytest.raises(CapeInputError, match="nlayers=3"):
        load_scgpt_checkpoint(tmp_path)
    (tmp_path / "args.json").write_text(json.dumps(args))
    state = torch.load(tmp_path / "best_model.pt")
    del state["transformer_encoder.layers.1.norm2.weight"]
    torch.save(state, tmp_path / "best_model.pt")
    with pytest.raises(CapeInputError, match="lacks 1 backbone weight"):
        load_scgpt_checkpoint(tmp_path)


def test_cell_transformer_from_scgpt(tmp_path):
    import anndata as ad
    import numpy as np

    from cape.models import CellTransformer

    ref = _write(tmp_path, "Wqkv")
    rng = np.random.default_rng(0)
    adata = ad.AnnData(np.log1p(rng.poisson(1.0, size=(12, 8)).astype(np.float32)))
    adata.var_names = ["G1", "G3", "G5", "G7", "G9", "UNKNOWN1", "UNKNOWN2", "G0"]
    model = CellTransformer.from_scgpt(tmp_path, adata, dropout=0.0, max_len=16, device="cpu")
    assert model.vocab.tokens == TOKENS
    for key, value in ref.state_dict().items():
        if key == "transformer_encoder.layers.0.linear1.weight":
            torch.testing.assert_close(model.backbone.state_dict()["layers.0.linear1.weight"], value)
    torch.testing.assert_close(model.expr_head.fc[4].weight, ref.decoder.fc[4].weight)
    out = model.embed(adata, copy=True)
    assert out.obsm["X_cape"].shape == (12, D)
    assert (out.var["cape_gene_embedding_n_cells"][["UNKNOWN1", "UNKNOWN2"]] == 0).all()
    assert (out.var["cape_gene_embedding_n_cells"]["G1"] > 0) or (adata[:, "G1"].X == 0).all()
    unknown = out.var_names.get_indexer(["UNKNOWN1", "UNKNOWN2"])
    assert (out.varm["cape_gene_embedding"][unknown] == 0).all()
    model.pretrain(adata, epochs=1, batch_size=4, validation_fraction=0.0)
    model.save(tmp_path / "m")
    loaded = CellTransformer.load(tmp_path / "m", adata, device="cpu")
    np.testing.assert_array_equal(loaded.embed(adata, copy=True).obsm["X_cape"],
                                  model.embed(adata, copy=True).obsm["X_cape"])
    other = adata[:, ["UNKNOWN1", "UNKNOWN2"]].copy()
    with pytest.raises(CapeInputError, match="none of the AnnData's genes"):
        model.embed(other)
