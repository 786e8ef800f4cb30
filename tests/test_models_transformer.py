"""CellTransformer training: pretraining, annotation, embeddings, early stopping, seeding and DDP on gloo."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from _models_data import cape_adata, one_thread  # noqa: F401  (fixture)

from cape import CapeInputError
from cape.models import CellTransformer

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


def test_fit_predict_embed(adata):
    model = CellTransformer(adata, "scgpt", "rope", **SMALL, seed=0)
    model.train(adata, "cell_type", epochs=12, batch_size=16, lr=3e-3, validation_fraction=0.0)
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
    table = model.gene_embedding_table()
    assert table.shape == (used.sum(), 32) and list(table.index) == list(adata.var_names[used])


def test_fit_roundtrip_keeps_the_classifier(adata, tmp_path):
    model = CellTransformer(adata, "scbert", "tape", **SMALL, seed=0)
    model.train(adata, "cell_type", epochs=1, batch_size=16)
    model.save(tmp_path / "m")
    loaded = CellTransformer.load(tmp_path / "m", adata, device="cpu")
    np.testing.assert_array_equal(model.predict(adata, return_probabilities=True),
                                  loaded.predict(adata, return_probabilities=True))
    assert loaded.labels == model.labels and loaded.history["fit"] == model.history["fit"]


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
def _with_unused_genes(adata, n_extra: int = 30):
    """``adata`` plus ``n_extra`` expressed genes outside var["cape_used"] (a raw matrix's other genes)."""
    import anndata as ad
    import scipy.sparse as sp

    rng = np.random.default_rng(5)
    extra = sp.csr_matrix(np.log1p(rng.poisson(2.0, size=(adata.n_obs, n_extra))).astype(np.float32))
    wide = ad.AnnData(sp.hstack([adata.X, extra]).tocsr(), obs=adata.obs.copy())
    wide.var_names = [*adata.var_names, *(f"OTHER{i}" for i in range(n_extra))]
    wide.var["cape_used"] = np.r_[adata.var["cape_used"].to_numpy(), np.zeros(n_extra, dtype=bool)]
    for key, value in adata.varm.items():
        wide.varm[key] = np.r_[value, np.full((n_extra, value.shape[1]), np.nan)]
    wide.var["cape_generality"] = np.r_[adata.var["cape_generality"].to_numpy(), np.zeros(n_extra)]
    wide.varp["cape_dag"] = sp.block_diag([adata.varp["cape_dag"], sp.csr_matrix((n_extra, n_extra))]).tocsr()
    return wide


def test_vocabulary_is_the_used_genes_by_default(adata, caplog):
    wide = _with_unused_genes(adata)
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


def test_used_vocabulary_survives_save_load_and_other_genes(adata, tmp_path):
    import json

    wide = _with_unused_genes(adata)
    model = CellTransformer(wide, "scgpt", "cape", **SMALL, seed=0)
    model.train(wide, "cell_type", epochs=2, batch_size=16, validation_fraction=0.0)
    model.save(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["vocabulary"] == "used"
    loaded = CellTransformer.load(tmp_path / "m", wide, device="cpu")
    assert loaded.vocabulary == "used" and loaded.vocab == model.vocab
    expected = model.predict(wide, return_probabilities=True)
    np.testing.assert_array_equal(loaded.predict(wide, return_probabilities=True), expected)
    # Genes outside the vocabulary change nothing: the same cells over the used genes alone predict the same.
    np.testing.assert_allclose(loaded.predict(adata[:, adata.var["cape_used"].to_numpy()].copy(),
                                              return_probabilities=True), expected, rtol=1e-6, atol=1e-7)
    out = loaded.embed(wide, copy=True)
    assert out.obsm["X_cape"].shape == (wide.n_obs, 32)
    # A vocabulary gene missing from the AnnData is still a mismatch.
    with pytest.raises(CapeInputError, match="1 of the model's 22 genes.*missing"):
        CellTransformer.load(tmp_path / "m", wide[:, 1:].copy())
    # Models saved before the option recorded it kept every gene and stay strict.
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    del cfg["vocabulary"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CapeInputError, match="vocabulary mismatch: 32 of the AnnData's"):
        CellTransformer.load(tmp_path / "m", wide)


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


def test_latent_representation_is_what_embed_writes(adata):
    model = CellTransformer(adata, "scgpt", "cape", **SMALL, seed=0)
    cells = model.get_latent_representation(adata)
    copy = model.embed(adata, copy=True)
    np.testing.assert_array_equal(cells, copy.obsm["X_cape"])
    assert cells.dtype == np.float32 and cells.shape == (adata.n_obs, SMALL["d_model"])


def test_save_refuses_an_existing_directory_unless_overwrite(adata, tmp_path):
    model = CellTransformer(adata, "scgpt", "cape", **SMALL, seed=0)
    model.save(tmp_path / "m")
    with pytest.raises(CapeInputError, match="exists"):
        model.save(tmp_path / "m")
    model.save(tmp_path / "m", overwrite=True)
    assert CellTransformer.load(tmp_path / "m", adata).seed == 0
