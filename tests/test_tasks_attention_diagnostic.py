"""Per-layer non-relativity of a CellTransformer: exact cases and the mean-logit bookkeeping."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _models_data import cape_adata, one_thread  # noqa: F401  (fixture)

from cape import CapeInputError
from cape.models import CellTransformer
from cape.models.tokenize import CellCollator
from cape.tasks.attention_diagnostic import _heads, layer_mean_logits, layer_non_relativity


def _constant_qk(model: CellTransformer, seed: int = 0) -> None:
    """q and k the same vector for every token in every layer: logits then depend on positions only."""
    g = torch.Generator().manual_seed(seed)
    for layer in model.backbone.layers:
        proj = layer.self_attn.in_proj
        with torch.no_grad():
            proj.weight.zero_()
            proj.bias.copy_(torch.randn(proj.bias.shape, generator=g))


@pytest.mark.usefixtures("one_thread")
def test_rope_with_constant_qk_is_purely_relative():
    adata = cape_adata(n_cells=24, n_genes=16)
    model = CellTransformer(adata, "scgpt", "rope", d_model=16, n_heads=2, n_layers=2, seed=0, device="cpu")
    _constant_qk(model)
    records = layer_non_relativity(model, adata, key="model", min_cells=1, bins=None)
    assert [r["layer"] for r in records] == [0, 1]
    assert all(r["metric"] == "offset" for r in records)
    assert all(r["nri"] < 1e-6 for r in records)


@pytest.mark.usefixtures("one_thread")
def test_trained_weights_are_not_relative_to_unrelated_positions():
    adata = cape_adata(n_cells=24, n_genes=16)
    model = CellTransformer(adata, "scgpt", "trainable_absolute", d_model=16, n_heads=2, n_layers=2, seed=0,
                            device="cpu")
    records = layer_non_relativity(model, adata, key="cape_poincare", min_cells=1, bins=8)
    assert all(r["metric"] == "poincare" for r in records)
    assert all(0.3 < r["nri"] <= 1.0 for r in records)
    assert records[0]["n_genes"] <= int(adata.var["cape_used"].sum())
    with pytest.raises(CapeInputError, match="no gene positions"):
        layer_non_relativity(model, adata, key="model")
    with pytest.raises(CapeInputError, match="not found"):
        layer_non_relativity(model, adata, key="nothere")


@pytest.mark.usefixtures("one_thread")
def test_mean_logits_match_explicit_first_layer_for_one_cell():
    adata = cape_adata(n_cells=6, n_genes=12)
    for arch, enc in (("scgpt", "cape"), ("scbert", "cape")):
        model = CellTransformer(adata, arch, enc, d_model=16, n_heads=2, n_layers=1, seed=1, device="cpu")
        one = adata[[2]]
        means, count = layer_mean_logits(model, one, n_cells=None)
        batch = next(iter(torch.utils.data.DataLoader(model._dataset(one), batch_size=1,
                                                      collate_fn=CellCollator(model.vocab.pad_id))))
        model.module.eval()
        bb = model.backbone
        with torch.no_grad():
            x, ctx = bb.encoder_input(batch["gene_ids"], batch["values"], batch["padding_mask"])
            layer = bb.layers[0]
            x_in = layer.norm1(x) if arch == "scbert" else x  # scBERT is pre-norm
            q, k, _ = layer.self_attn.in_proj(x_in).chunk(3, dim=-1)
            expected = bb.encoding.logits(_heads(q, layer.self_attn.n_heads), _heads(k, layer.self_attn.n_heads),
                                          ctx, 0).mean(1)[0].double().numpy()
        ids = batch["gene_ids"][0].numpy()
        genes = ids[1:]
        got = means[0][np.ix_(genes, genes)]
        np.testing.assert_allclose(got, expected[1:, 1:], rtol=1e-5, atol=1e-6)
        assert count[np.ix_(genes, genes)].min() == 1 and count.sum() == len(genes) ** 2
        assert math.isnan(means[0][ids[0], ids[0]])  # <cls> is left out


def test_bad_arguments():
    adata = cape_adata(n_cells=6, n_genes=12)
    model = CellTransformer(adata, "scgpt", "rope", d_model=16, n_heads=2, n_layers=1, seed=0, device="cpu")
    with pytest.raises(CapeInputError, match="min_cells"):
        layer_non_relativity(model, adata, min_cells=0)
    with pytest.raises(CapeInputError, match="n_cells"):
        layer_mean_logits(model, adata, n_cells=0)
    with pytest.raises(CapeInputError, match="too few gene pairs"):
        layer_non_relativity(model, adata, min_cells=100)


@pytest.mark.usefixtures("one_thread")
def test_cape_evaluate_reports_non_relativity_per_layer(tmp_path):
    import json

    from cape.cli import main

    adata = cape_adata(n_cells=24, n_genes=16)
    model = CellTransformer(adata, "scgpt", "rope", d_model=16, n_heads=2, n_layers=2, seed=0, device="cpu")
    model.save(tmp_path / "model")
    model.embed(adata)  # `cape evaluate` reads a trained run: it needs obsm['X_cape']
    adata.write_h5ad(tmp_path / "trained.h5ad")
    metrics, report = tmp_path / "metrics.json", tmp_path / "report.md"
    assert main(["--quiet", "evaluate", "-i", str(tmp_path / "trained.h5ad"), "--metrics", str(metrics),
                 "--report", str(report), "--label-key", "none", "--model", str(tmp_path / "model")]) == 0
    rows = [r for r in json.loads(metrics.read_text()) if r["task"] == "attention"]
    assert {(r["method"], r["metric"]) for r in rows} == {
        (f"rope vs {key}", f"non-relativity layer {layer}")
        for key in ("own positions", "Poincaré distance") for layer in (0, 1)}
    assert all(0.0 <= r["value"] <= 1.0 for r in rows)
    assert "non-relativity layer 1" in report.read_text()


def _many_genes(n_cells: int = 60, n_genes: int = 3000, n_used: int = 300, seed: int = 0):
    """A raw-matrix-shaped AnnData: sparse log counts over many genes, CAPE keys on the first ``n_used``."""
    import anndata as ad
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    # The used (highly variable) genes are detected more often than the rest, as after HVG selection.
    X = sp.hstack([sp.random(n_cells, n_used, density=0.5, random_state=seed, dtype=np.float32),
                   sp.random(n_cells, n_genes - n_used, density=0.05, random_state=seed + 1, dtype=np.float32)])
    X = sp.csr_matrix(X)
    X.data = np.log1p(np.ceil(X.data * 5)).astype(np.float32)
    adata = ad.AnnData(X)
    adata.var_names = [f"G{i}" for i in range(n_genes)]
    used = np.zeros(n_genes, dtype=bool)
    used[:n_used] = True
    adata.var["cape_used"] = used
    rows = rng.integers(0, n_used, 600)
    cols = rng.integers(0, n_used, 600)
    keep = rows < cols
    adata.varp["cape_dag"] = sp.csr_matrix((np.ones(keep.sum()), (rows[keep], cols[keep])), shape=(n_genes, n_genes))
    e = np.full((n_genes, 4), np.nan)
    e[:n_used] = rng.normal(size=(n_used, 4))
    e[:n_used] *= 0.8 * rng.random((n_used, 1)) / np.linalg.norm(e[:n_used], axis=1, keepdims=True)
    adata.varm["cape_poincare"] = e
    adata.varm["cape_angles"] = np.pi / 4 * e
    adata.var["cape_generality"] = rng.random(n_genes)
    return adata


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("vocabulary", ["used", "all"])
def test_evaluate_non_relativity_never_builds_an_all_genes_square(tmp_path, monkeypatch, vocabulary):
    """The evaluate step's attention diagnostics over 3,000 genes (300 used) work on ≤ 300 × 300 tables."""
    import tracemalloc

    import cape.tasks.attention_diagnostic as lr
    from cape.report import attention_records

    adata = _many_genes()
    model = CellTransformer(adata, "scgpt", "cape", d_model=16, n_heads=2, n_layers=2, max_len=256, seed=0,
                            device="cpu", vocabulary=vocabulary)
    assert len(model.vocab.genes) == (300 if vocabulary == "used" else 3000)
    model.save(tmp_path / "model")
    shapes = []
    original = lr.layer_mean_logits

    def spy(*args, **kwargs):
        means, count = original(*args, **kwargs)
        shapes.extend([count.shape, *(m.shape for m in means)])
        return means, count

    monkeypatch.setattr(lr, "layer_mean_logits", spy)
    tracemalloc.start()
    try:
        records = attention_records(adata, tmp_path / "model", n_cells=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert {r["method"] for r in records} == {"cape vs own positions", "cape vs Poincaré distance"}
    assert shapes and all(s[0] == s[1] <= 300 for s in shapes)
    # One 3,000 × 3,000 float64 array is 72 MB; NumPy's allocations here stay far below a quarter of it.
    assert peak < 3000 * 3000 * 8 / 4


@pytest.mark.usefixtures("one_thread")
def test_non_relativity_caps_the_genes_it_measures(caplog):
    adata = _many_genes(n_genes=400, n_used=300)
    model = CellTransformer(adata, "scgpt", "cape", d_model=16, n_heads=2, n_layers=1, max_len=64, seed=0,
                            device="cpu")
    with caplog.at_level("INFO", logger="cape"):
        capped = layer_non_relativity(model, adata, key="cape_poincare", max_genes=40)
    assert capped[0]["n_genes"] <= 40 and "measuring the 40 detected in the most cells" in caplog.text
    full = layer_non_relativity(model, adata, key="cape_poincare")
    assert 40 < full[0]["n_genes"] <= 300
    with pytest.raises(CapeInputError, match="max_genes"):
        layer_non_relativity(model, adata, max_genes=2)
