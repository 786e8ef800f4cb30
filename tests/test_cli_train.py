"""``cape train``: pretrain + fine-tune from the command line; bad input gives one line and no output."""

from __future__ import annotations

import anndata as ad
import pytest
from _models_data import cape_adata, one_thread  # noqa: F401  (fixture)

from cape.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_cape_train_writes_model_and_embeddings(tmp_path):
    cape_adata(n_cells=40).write_h5ad(tmp_path / "in.h5ad")
    out = tmp_path / "out" / "trained.h5ad"
    code = main(["--quiet", "train", "-i", str(tmp_path / "in.h5ad"), "-o", str(out), "--label-key", "cell_type",
                 "--pretrain-epochs", "1", "--epochs", "1", "--d-model", "16", "--n-heads", "2", "--max-len", "32",
                 "--encoding", "cape", "--encoding-option", "scale=0.5"])
    assert code == 0
    result = ad.read_h5ad(out)
    assert result.obsm["X_cape"].shape == (40, 16)
    assert set(result.obs["cape_cell_type_prediction"]) <= {"t", "b", "nk"}
    assert set(result.uns["cape"]["model"]["history"]) == {"pretrain", "train"}
    # fine-tuned on a stratified 30 % of the cells (Supp. F.1.1); the rest are test cells for `cape evaluate`
    split = result.obs["cape_split"].value_counts()
    assert split["fine_tune"] == 12 and split["test"] == 28
    model_dir = tmp_path / "out" / "trained_model"
    assert {p.name for p in model_dir.iterdir()} == {"config.json", "vocab.json", "model.pt", "positions.pt"}


def test_cape_train_scbert_complement_keeps_its_static_gene_embedding(tmp_path):
    cape_adata(n_cells=40).write_h5ad(tmp_path / "in.h5ad")
    out = tmp_path / "trained.h5ad"
    code = main(["--quiet", "train", "-i", str(tmp_path / "in.h5ad"), "-o", str(out), "--label-key", "cell_type",
                 "--epochs", "1", "--d-model", "16", "--n-heads", "2", "--max-len", "32", "--architecture", "scbert",
                 "--encoding", "grape_a", "--integration", "complement"])
    assert code == 0  # a logit encoding on scBERT: exact softmax attention
    model_dir = tmp_path / "trained_model"
    assert (model_dir / "identity.pt").is_file()  # the co-expression vectors travel with the model
    assert ad.read_h5ad(out).uns["cape"]["model"]["backbone"]["integration"] == "complement"


def test_cape_train_bad_input_is_one_line(tmp_path, capsys):
    cape_adata(n_cells=20).write_h5ad(tmp_path / "in.h5ad")
    out = tmp_path / "o.h5ad"
    assert main(["train", "-i", str(tmp_path / "in.h5ad"), "-o", str(out), "--label-key", "nope"]) == 2
    assert main(["train", "-i", str(tmp_path / "in.h5ad"), "-o", str(out), "--encoding", "alibi"]) == 2
    assert main(["train", "-i", str(tmp_path / "in.h5ad"), "-o", str(out), "--checkpoint", str(tmp_path),
                 "--integration", "replace", "--pretrain-epochs", "0"]) == 2
    text = capsys.readouterr().err
    assert "Traceback" not in text
    err = [line for line in text.splitlines() if line.startswith("cape: error:")]  # info lines may come between
    assert len(err) == 3 and "nope" in err[0] and "alibi" in err[1] and "--integration replace" in err[2]
    assert not out.exists() and not (tmp_path / "o_model").exists()


def test_length_grouping_reaches_both_plans_and_is_checked(tmp_path, capsys, monkeypatch):
    from cape.cli import train_command

    plans = []
    monkeypatch.setattr(train_command.CellTransformer, "pretrain",
                        lambda self, adata, **kw: plans.append(kw["plan"]) or [])
    monkeypatch.setattr(train_command.CellTransformer, "train",
                        lambda self, adata, label_key, **kw: plans.append(kw["plan"]) or [])
    cape_adata(n_cells=20).write_h5ad(tmp_path / "in.h5ad")
    base = ["--quiet", "train", "-i", str(tmp_path / "in.h5ad"), "--label-key", "cell_type", "--d-model", "16",
            "--n-heads", "2", "--max-len", "32"]
    for flag, expected in ([], 16), (["--length-grouping", "4"], 4), (["--length-grouping", "0"], None):
        plans.clear()
        assert main([*base, "-o", str(tmp_path / f"o{expected}.h5ad"), *flag]) == 0
        assert [plan.length_grouping for plan in plans] == [expected, expected]
    with pytest.raises(SystemExit) as refused:
        main([*base, "-o", str(tmp_path / "bad.h5ad"), "--length-grouping", "-1"])
    assert refused.value.code == 2
    assert "expected a whole number >= 0" in capsys.readouterr().err
    assert not (tmp_path / "bad.h5ad").exists()
