"""Model directories (cape.models.persistence): save/load round trips, overwrite rules, vocabulary checks on load
and damaged model directories."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _models_data import cape_adata, one_thread, with_unused_genes  # noqa: F401  (fixture)

from cape import CapeInputError
from cape.models import CellTransformer

SMALL = dict(d_model=32, n_heads=4, n_layers=2, max_len=32, dropout=0.0)
TINY = dict(d_model=16, n_heads=2, n_layers=2, max_len=32, dropout=0.0)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def adata():
    return cape_adata(n_cells=60)


def test_train_roundtrip_keeps_the_classifier(adata, tmp_path):
    model = CellTransformer(adata, "scbert", "tape", **SMALL, seed=0)
    model.train(adata, "cell_type", epochs=1, batch_size=16)
    model.save(tmp_path / "m")
    loaded = CellTransformer.load(tmp_path / "m", adata, device="cpu")
    np.testing.assert_array_equal(model.predict(adata, return_probabilities=True),
                                  loaded.predict(adata, return_probabilities=True))
    assert loaded.labels == model.labels and loaded.history["train"] == model.history["train"]


def test_save_refuses_an_existing_directory_unless_overwrite(adata, tmp_path):
    model = CellTransformer(adata, "scgpt", "none", **TINY, seed=0)
    target = model.save(tmp_path / "m")
    before = (target / "model.pt").read_bytes()
    with pytest.raises(CapeInputError, match=r"model directory .*m already exists and is not empty; pass "
                                             r"overwrite=True") as err:
        model.save(target)
    assert "\n" not in str(err.value)
    assert (target / "model.pt").read_bytes() == before                 # refused: nothing touched
    other = CellTransformer(adata, "scgpt", "none", **TINY, seed=1)
    other.save(target, overwrite=True)                                  # replaced
    assert not torch.equal(CellTransformer.load(target).module.state_dict()["expr_head.fc.0.weight"],
                           model.module.state_dict()["expr_head.fc.0.weight"])
    # An existing empty directory is no model to lose; a foreign non-empty one is never replaced.
    (tmp_path / "empty").mkdir()
    model.save(tmp_path / "empty")
    assert (tmp_path / "empty" / "config.json").is_file()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(CapeInputError, match="not a cape model directory; refusing"):
        model.save(tmp_path / "mine", overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    assert not list(tmp_path.glob(".m.*")) and not list(tmp_path.glob(".mine.*"))   # no temporary folders left


def test_saved_config_keeps_its_keys(adata, tmp_path):
    """The config.json keys that model directories have always had (loading reads them)."""
    model = CellTransformer(adata, "scgpt", "cape", **TINY, seed=0)
    model.train(adata, "cell_type", epochs=1, batch_size=16, validation_fraction=0.0)
    cfg = json.loads((model.save(tmp_path / "m") / "config.json").read_text())
    assert set(cfg) == {"cape_version", "architecture", "backbone", "tokenizer", "layer", "use_raw", "vocabulary",
                        "labels", "label_key", "n_cls_layers", "pooling", "cell_head", "seed", "history",
                        "strict_genes", "value_scale"}
    assert set(cfg["history"]) == {"train"} and set(cfg["tokenizer"]) == {"binning", "n_bins", "max_len",
                                                                         "include_zero_genes"}
    assert {"d_model", "n_heads", "n_layers", "d_ff", "dropout", "encoding", "encoding_options"} <= set(cfg["backbone"])
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.pt", "positions.pt",
                                                                   "vocab.json"]
    # Every key is required: a directory without one is refused in one line.
    del cfg["pooling"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CapeInputError, match="damaged cape model directory .*pooling"):
        CellTransformer.load(tmp_path / "m", device="cpu")


def test_used_vocabulary_survives_save_load_and_other_genes(adata, tmp_path):
    wide = with_unused_genes(adata)
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


def test_vocabulary_mismatch_on_load_says_how_many(adata, tmp_path):
    model = CellTransformer(adata, "scgpt", "none", vocabulary="all", **TINY)
    model.save(tmp_path / "m")
    other = adata[:, 3:].copy()
    other.var_names = [*other.var_names[:-2], "NEW1", "NEW2"]
    with pytest.raises(CapeInputError, match="2 of the AnnData's 21 genes are not in.*5 of the model's 24"):
        CellTransformer.load(tmp_path / "m", other)
    with pytest.raises(CapeInputError, match="vocabulary mismatch"):
        model.embed(other)
    with pytest.raises(CapeInputError, match="not a cape model directory"):
        CellTransformer.load(tmp_path / "nothing")


def test_static_absolute_from_gene2vec_file_survives_save_load(adata, tmp_path):
    path = tmp_path / "gene2vec.txt"
    rng = np.random.default_rng(0)
    path.write_text("".join(f"{g} " + " ".join(f"{v:.4f}" for v in rng.normal(size=6)) + "\n"
                            for g in adata.var_names[:20]))
    model = CellTransformer(adata, "scbert", "static_absolute", encoding_options={"gene2vec_path": str(path)},
                            **TINY)
    table = model.backbone.encoding.table
    assert (table[model.vocab.lookup(adata.var_names[20:])] == 0).all()   # genes absent from the file
    assert (table[model.vocab.lookup(adata.var_names[:20])] != 0).any()
    model.save(tmp_path / "m")
    path.unlink()                                            # the saved model no longer needs the file
    loaded = CellTransformer.load(tmp_path / "m", adata)
    assert torch.equal(loaded.backbone.encoding.table, table)
