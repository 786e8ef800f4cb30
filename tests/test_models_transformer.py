"""CellTransformer training (cape.models.training): pretraining, annotation, embeddings, early stopping, the
learning-rate schedule, seeding, the grouped constructor options and DDP on gloo."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from _models_data import cape_adata, one_thread, with_unused_genes  # noqa: F401  (fixture)
from hypothesis import given, settings
from hypothesis import strategies as st

from cape import CapeInputError
from cape.models import CellTransformer, NetworkConfig, TokenizerConfig
from cape.models.training.engine import lr_factor

SMALL = dict(d_model=32, n_heads=4, n_layers=2, max_len=32, dropout=0.0)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def adata():
    return cape_adata(n_cells=60)


@pytest.mark.parametrize("architecture", ["scgpt", "scbert"])
def test_pretraining_lowers_the_masked_loss(adata, architecture):
    model = CellTransformer(adata, architecture, "cape", **SMALL, seed=0)
    history = model.pretrain(adata, epochs=6, batch_size=16, lr=3e-3, validation_fraction=0.2,
                             early_stopping_patience=None)
    assert len(history) == 6 and {"train_loss", "val_loss", "cells_per_s"} <= set(history[0])
    assert history[-1]["train_loss"] < 0.8 * history[0]["train_loss"]
    assert min(h["val_loss"] for h in history) < history[0]["val_loss"]


def test_train_predict_embed(adata):
    model = CellTransformer(adata, "scgpt", "rope", **SMALL, seed=0)
    n_params = sum(p.numel() for p in model.module.parameters())
    assert repr(model).startswith("CellTransformer(scgpt, encoding='rope', integration='complement', ")
    assert f"d_model=32, n_layers=2, n_heads=4, dropout=0.0, {n_params:,} parameters, cpu; untrained)" in repr(model)
    model.train(adata, "cell_type", epochs=12, batch_size=16, lr=3e-3, validation_fraction=0.0)
    assert repr(model).endswith("; train)")
    labels = model.predict(adata, key_added="pred")
    assert list(labels.categories) == ["b", "nk", "t"]
    accuracy = np.mean(np.asarray(labels) == adata.obs["cell_type"].to_numpy())
    assert accuracy > 0.7                                    # marker genes make the three groups separable
    assert (adata.obs["pred"].to_numpy() == np.asarray(labels)).all()
    probs = model.predict(adata, return_probabilities=True)
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-5)
    out = model.embed(adata, copy=True)
    assert out.obsm["X_cape"].shape == (adata.n_obs, 32) and np.isfinite(out.obsm["X_cape"]).all()
    assert out.varm["cape_gene_embedding"].shape == (adata.n_vars, 32)
    n_cells = out.var["cape_gene_embedding_n_cells"].to_numpy()
    assert n_cells.max() <= adata.n_obs and (n_cells > 0).any()
    used = adata.var["cape_used"].to_numpy()
    # The vocabulary is the used genes: the others are never tokenised and get zero vectors.
    assert (n_cells[~used] == 0).all() and not out.varm["cape_gene_embedding"][~used].any()
    assert out.uns["cape"]["model"]["architecture"] == "scgpt" and out.uns["cape"]["model"]["vocabulary"] == "used"
    assert "X_cape" not in adata.obsm                        # copy=True leaves the input alone
    # get_latent_representation: the same numbers embed writes, for the trained pooling and any other.
    np.testing.assert_array_equal(model.get_latent_representation(adata), out.obsm["X_cape"])
    cls = model.embed(adata, copy=True, pooling="cls", gene_key=None).obsm["X_cape"]
    np.testing.assert_array_equal(model.get_latent_representation(adata, pooling="cls"), cls)
    assert model.get_latent_representation(adata).dtype == np.float32
    table = model.gene_embedding_table()
    assert table.shape == (used.sum(), 32) and list(table.index) == list(adata.var_names[used])


@given(st.integers(1, 200), st.floats(0.0, 0.9), st.sampled_from(["constant", "cosine"]))
@settings(max_examples=60, deadline=None)
def test_lr_factor_warms_up_then_decays(total, warmup, schedule):
    f = [lr_factor(s, total, schedule, warmup) for s in range(total)]
    n_warmup = round(warmup * total)
    assert all(0.0 <= x <= 1.0 for x in f)
    assert f[:n_warmup] == sorted(f[:n_warmup]) and (n_warmup == 0 or f[n_warmup - 1] == 1.0)
    after = f[n_warmup:]
    assert after == sorted(after, reverse=True)
    if schedule == "constant":
        assert all(x == 1.0 for x in after)
    elif after:
        assert after[0] == 1.0
        mid = n_warmup + (total - n_warmup) // 2
        if (total - n_warmup) % 2 == 0 and mid < total:
            assert f[mid] == pytest.approx(0.5)                              # half-way down the cosine
    assert lr_factor(total, total, "cosine", warmup) == pytest.approx(0.0, abs=1e-12) or n_warmup >= total


def test_grouped_options_equal_the_keywords(adata):
    flat = CellTransformer(adata, "scbert", "cape", d_model=32, n_heads=4, n_layers=1, dropout=0.0, max_len=16,
                           n_bins=7, gene_embedding=True, n_cls_layers=2, seed=3)
    grouped = CellTransformer(adata, "scbert", "cape", network=NetworkConfig(d_model=32, n_layers=1, dropout=0.0,
                                                                            gene_embedding=True, n_cls_layers=2),
                              tokenizer=TokenizerConfig(binning="log2", n_bins=7, max_len=16), seed=3)
    assert grouped.tokenizer == flat.tokenizer == TokenizerConfig("log2", 7, 16, False)
    assert grouped._config() == flat._config()
    state = flat.module.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in grouped.module.state_dict().items())
    # A keyword overrides its group; the default tokenizer is the architecture's binning.
    mixed = CellTransformer(adata, "scgpt", "none", network=NetworkConfig(d_model=32), d_model=16, max_len=8)
    assert mixed.backbone.d_model == 16 and mixed.tokenizer == TokenizerConfig("quantile", 51, 8, False)


def test_same_seed_same_model(adata):
    runs = []
    for _ in range(2):
        m = CellTransformer(adata, "scgpt", "cape", **{**SMALL, "dropout": 0.1}, seed=7)
        h = m.pretrain(adata, epochs=2, batch_size=16)
        runs.append((h, {k: v.clone() for k, v in m.module.state_dict().items()}))
    assert [r["train_loss"] for r in runs[0][0]] == [r["train_loss"] for r in runs[1][0]]
    assert all(torch.equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])


def test_early_stopping_stops_when_validation_does_not_improve(adata):
    model = CellTransformer(adata, "scgpt", "none", **SMALL)
    history = model.pretrain(adata, epochs=20, batch_size=16, lr=0.0, weight_decay=0.0,
                             early_stopping_patience=2)
    assert len(history) == 3                                 # best at epoch 1, two epochs without improvement


def test_training_bad_input(adata):
    model = CellTransformer(adata, "scgpt", "none", **SMALL)
    with pytest.raises(CapeInputError, match="label key 'missing'"):
        model.train(adata, "missing")
    with pytest.raises(CapeInputError, match="no annotation head"):
        model.predict(adata)
    with pytest.raises(CapeInputError, match="mask_ratio"):
        model.pretrain(adata, epochs=1, mask_ratio=0.0)
    one = adata.copy()
    one.obs["one"] = "x"
    with pytest.raises(CapeInputError, match="single class"):
        model.train(one, "one")
    with pytest.raises(CapeInputError, match="layer 'counts'"):
        CellTransformer(adata, "scgpt", "none", layer="counts")


# ------------------------------------------------------------------------------------------------ vocabulary
def test_vocabulary_is_the_used_genes_by_default(adata, caplog):
    wide = with_unused_genes(adata)
    used = list(wide.var_names[wide.var["cape_used"].to_numpy()])
    model = CellTransformer(wide, "scgpt", "cape", **SMALL, seed=0)
    assert model.vocabulary == "used" and model.vocab.genes == used
    assert CellTransformer(wide, "scgpt", "cape", **SMALL, vocabulary="all").vocab.genes == list(wide.var_names)
    # Cells are tokenised over the vocabulary's columns only, and a sparse matrix stays sparse.
    data = model._dataset(wide)
    assert data.X.shape == (wide.n_obs, len(used)) and hasattr(data.X, "indptr")
    tokens = np.concatenate([data[i]["gene_ids"][1:] for i in range(len(data))])
    assert set(tokens) <= set(model.vocab.lookup(used))
    # The positions are the used genes' own (rows of genes outside the vocabulary do not exist).
    assert model.positions.vectors.shape[0] == len(model.vocab)
    no_flag = wide.copy()
    del no_flag.var["cape_used"]
    with caplog.at_level("INFO", logger="cape"):
        fallback = CellTransformer(no_flag, "scgpt", "none", **SMALL)
    assert fallback.vocab.genes == list(wide.var_names) and "var['cape_used'] not found" in caplog.text
    none_used = wide.copy()
    none_used.var["cape_used"] = False
    with pytest.raises(CapeInputError, match="marks none"):
        CellTransformer(none_used, "scgpt", "none", **SMALL)
    with pytest.raises(CapeInputError, match="unknown vocabulary"):
        CellTransformer(wide, "scgpt", "none", vocabulary="hvg")


# ------------------------------------------------------------------------------------------------ DDP
def _ddp_worker(rank: int, world: int, h5ad: str, init_file: str, out: str) -> None:
    import anndata as ad
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        data = ad.read_h5ad(h5ad)
        model = CellTransformer(data, "scgpt", "cape", **SMALL, seed=5)
        history = model.pretrain(data, epochs=2, batch_size=4, validation_fraction=0.0)
        if rank == 0:
            torch.save({"state": model.module.state_dict(), "history": history}, out)
    finally:
        dist.destroy_process_group()


def test_ddp_on_two_cpu_processes_matches_single_process(tmp_path):
    import torch.multiprocessing as mp

    data = cape_adata(n_cells=32)
    data.write_h5ad(tmp_path / "cells.h5ad")
    out = tmp_path / "ddp.pt"
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "cells.h5ad"), str(tmp_path / "init"), str(out)), nprocs=2,
             join=True)
    ddp = torch.load(out, weights_only=False)
    single = CellTransformer(data, "scgpt", "cape", **SMALL, seed=5)
    history = single.pretrain(data, epochs=2, batch_size=8, validation_fraction=0.0)
    for a, b in zip(history, ddp["history"], strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    state = single.module.state_dict()
    moved = 0.0
    for key, value in state.items():
        torch.testing.assert_close(ddp["state"][key], value, rtol=1e-4, atol=1e-5)
        moved += float((value - CellTransformer(data, "scgpt", "cape", **SMALL, seed=5).module.state_dict()[key])
                       .abs().sum()) if key.endswith("in_proj.weight") else 0.0
    assert moved > 0                                         # training did change the weights
    assert os.path.exists(out)
