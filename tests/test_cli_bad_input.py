"""Bad input on every stage of the CLI: exit status 2, one line ``cape: error: ...`` naming the problem (and the
command to run first, where a previous stage is missing), and no output left behind.

Everything runs in-process through ``cape.cli.main`` on tiny AnnData (a few seconds in all).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
from _models_data import cape_adata, one_thread  # noqa: F401  (fixture)

import cape
from cape.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_MODEL = ["--d-model", "16", "--n-heads", "2", "--max-len", "16", "--epochs", "1"]


def run(capsys, *args: str) -> subprocess.CompletedProcess:
    try:
        code = main(["--quiet", *args])
    except SystemExit as exit_:  # argparse usage errors
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


def assert_refused(proc: subprocess.CompletedProcess, *words: str, outputs=()) -> None:
    """Exit 2, exactly one ``cape: error:`` line containing ``words``, and none of ``outputs`` written."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("cape: error: ") and "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    for out in outputs:
        assert not Path(out).exists(), f"partial output {out}"
        leftovers = [p for p in Path(out).parent.glob(f".{Path(out).name}.*")] if Path(out).parent.exists() else []
        assert not leftovers, leftovers


def _write(tmp_path: Path, adata: ad.AnnData, name: str) -> str:
    path = tmp_path / name
    adata.write_h5ad(path)
    return str(path)


# ------------------------------------------------------------------------------ --output equal to --input
@pytest.mark.parametrize("command", [
    ["preprocess", "--n-top-genes", "10", "--min-genes", "1"],
    ["causal", "--epochs", "1"],
    ["embed", "--epochs", "1"],
    ["encode"],
    ["train", *TINY_MODEL],
])
@pytest.mark.parametrize("spelling", ["same", "relative", "symlink"])
def test_output_equal_to_input_is_refused(tmp_path, capsys, monkeypatch, command, spelling):
    adata = cape_adata(n_cells=20)
    adata.X = adata.X.toarray().round()  # counts, so `cape preprocess` would accept the file
    src = Path(_write(tmp_path, adata, "data.h5ad"))
    before = src.read_bytes()
    if spelling == "same":
        out = str(src)
    elif spelling == "relative":  # ./sub/../data.h5ad from the file's folder
        monkeypatch.chdir(tmp_path)
        (tmp_path / "sub").mkdir()
        out = "sub/../data.h5ad"
    else:
        (tmp_path / "link.h5ad").symlink_to(src)
        out = str(tmp_path / "link.h5ad")
    proc = run(capsys, command[0], "--input", str(src), "--output", out, *command[1:])
    assert_refused(proc, "is the input file", "--output")
    assert src.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["data.h5ad"] + {"relative": ["sub"], "symlink": ["link.h5ad"], "same": []}[spelling])


def test_train_model_dir_equal_to_input_is_refused(tmp_path, capsys):
    src = _write(tmp_path, cape_adata(n_cells=20), "data.h5ad")
    proc = run(capsys, "train", "-i", src, "-o", str(tmp_path / "o.h5ad"), "--model-dir", src, *TINY_MODEL)
    assert_refused(proc, "--model-dir", "is the input file", outputs=[tmp_path / "o.h5ad"])


def test_check_output_paths(tmp_path):
    from cape.cli._command_io import check_output

    (tmp_path / "a.h5ad").write_text("x")
    assert check_output(str(tmp_path / "b.h5ad"), str(tmp_path / "a.h5ad"), None, "dataset:krumsiek11") == \
        tmp_path / "b.h5ad"
    os.link(tmp_path / "a.h5ad", tmp_path / "hard.h5ad")
    with pytest.raises(cape.CapeInputError, match="is the input file"):
        check_output(str(tmp_path / "hard.h5ad"), str(tmp_path / "a.h5ad"))
    with pytest.raises(cape.CapeInputError, match="--metrics must end in .json"):
        check_output(str(tmp_path / "m.txt"), suffix=".json", option="--metrics")
    # a folder that cannot be made or written is refused before any work
    assert check_output(str(tmp_path / "new" / "deeper" / "o.h5ad")) == tmp_path / "new" / "deeper" / "o.h5ad"
    assert not (tmp_path / "new").exists()
    with pytest.raises(cape.CapeInputError, match="a.h5ad is a file, not a folder"):
        check_output(str(tmp_path / "a.h5ad" / "o.h5ad"))


def test_an_output_that_cannot_be_written_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    src = _write(tmp_path, cape_adata(n_cells=20), "data.h5ad")
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path / "ro" else real(p, mode))
    (tmp_path / "ro").mkdir()
    proc = run(capsys, "encode", "--input", src, "--output", str(tmp_path / "ro" / "sub" / "o.h5ad"))
    assert_refused(proc, "cannot write in", "read-only", outputs=[tmp_path / "ro" / "sub" / "o.h5ad"])
    assert not (tmp_path / "ro" / "sub").exists()
    # where the check cannot see it coming, the write itself fails in one line, e.g. a file where a folder must be
    from cape._io import write_h5ad

    with pytest.raises(cape.CapeInputError, match="cannot write .*o.h5ad"):
        write_h5ad(cape_adata(n_cells=20), tmp_path / "data.h5ad" / "o.h5ad")


# ------------------------------------------------------------------------- a previous stage was not run
def _without(key: str) -> ad.AnnData:
    adata = cape_adata(n_cells=20)
    if key == "raw":
        adata.X = sp.csr_matrix(np.expm1(adata.X.toarray()).round())
        del adata.var["cape_used"]
    else:
        field, name = key.split(":")
        del getattr(adata, field)[name]
    return adata


@pytest.mark.parametrize("command, missing, words", [
    (["causal", "--epochs", "1"], "raw", ["raw counts", "run `cape preprocess` first", "--use-genes all"]),
    (["embed", "--epochs", "1"], "varp:cape_dag", ["varp['cape_dag'] not found", "`cape causal`"]),
    (["encode"], "varm:cape_poincare", ["varm['cape_poincare'] not found", "`cape embed`"]),
    (["train", *TINY_MODEL], "varm:cape_angles", ["varm['cape_angles'] missing", "`cape encode`"]),
])
def test_missing_previous_stage_names_the_command(tmp_path, capsys, command, missing, words):
    src = _write(tmp_path, _without(missing), "in.h5ad")
    out = tmp_path / "out.h5ad"
    proc = run(capsys, command[0], "-i", src, "-o", str(out), *command[1:])
    assert_refused(proc, *words, outputs=[out, tmp_path / "out_model"])


def test_evaluate_untrained_file_asks_for_train(tmp_path, capsys):
    src = _write(tmp_path, cape_adata(n_cells=20), "in.h5ad")
    metrics, report = tmp_path / "m.json", tmp_path / "r.md"
    proc = run(capsys, "evaluate", "-i", src, "--metrics", str(metrics), "--report", str(report))
    assert_refused(proc, "obsm['X_cape']", "run `cape train` first", outputs=[metrics, report])
    assert not (tmp_path / "r_figures").exists()


# -------------------------------------------------------------------------- user adjacency given to embed
def _adjacency_file(tmp_path: Path, kind: str, adata: ad.AnnData) -> str:
    n = adata.n_vars
    dag = np.triu(np.ones((n, n)), k=1) * 0.5
    if kind == "cyclic.npy":
        dag[n - 1, 0] = 0.7  # closes 0 → … → n-1 → 0
        np.save(tmp_path / "adj.npy", dag)
        return str(tmp_path / "adj.npy")
    if kind == "nonsquare.npy":
        np.save(tmp_path / "adj.npy", dag[:, :-1])
        return str(tmp_path / "adj.npy")
    if kind == "wrong_size.npz":
        sp.save_npz(tmp_path / "adj.npz", sp.csr_matrix(dag[:-2, :-2]))
        return str(tmp_path / "adj.npz")
    names = list(adata.var_names)
    if kind == "nonsquare.csv":
        pd.DataFrame(dag[:, :-1], index=names, columns=names[:-1]).to_csv(tmp_path / "adj.csv")
    elif kind == "unknown_gene.csv":
        pd.DataFrame(dag, index=[*names[:-1], "NOPE"], columns=[*names[:-1], "NOPE"]).to_csv(tmp_path / "adj.csv")
    elif kind == "cyclic.csv":
        dag[3, 1] = 1.0
        pd.DataFrame(dag, index=names, columns=names).to_csv(tmp_path / "adj.csv")
    else:
        (tmp_path / "adj.csv").write_bytes(b"\x00\x01 not a csv \xff")
        return str(tmp_path / "adj.npy.csv")
    return str(tmp_path / "adj.csv")


@pytest.mark.parametrize("kind, words", [
    ("cyclic.npy", ["directed cycle", "must be a DAG"]),
    ("cyclic.csv", ["directed cycle", "GENE1"]),
    ("nonsquare.npy", ["must be square", "20×19"]),
    ("nonsquare.csv", ["must be square", "20×19"]),
    ("wrong_size.npz", ["18×18", "20 genes"]),
    ("unknown_gene.csv", ["not in the data", "'NOPE'"]),
    ("missing", ["--adjacency file not found"]),
])
def test_embed_refuses_bad_user_adjacency(tmp_path, capsys, kind, words):
    adata = cape_adata(n_cells=20, n_genes=20)
    src = _write(tmp_path, adata, "in.h5ad")
    out = tmp_path / "out.h5ad"
    proc = run(capsys, "embed", "-i", src, "-o", str(out), "--epochs", "2",
               "--adjacency", _adjacency_file(tmp_path, kind, adata))
    assert_refused(proc, *words, outputs=[out])


def test_embed_refuses_cyclic_graph_in_the_file(tmp_path, capsys):
    adata = cape_adata(n_cells=20)
    dag = adata.varp["cape_dag"].toarray()
    dag[0, 1] = dag[1, 0] = 0.5
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    out = tmp_path / "out.h5ad"
    proc = run(capsys, "embed", "-i", _write(tmp_path, adata, "in.h5ad"), "-o", str(out), "--epochs", "2")
    assert_refused(proc, "directed cycle", "GENE0 -> GENE1 -> GENE0", outputs=[out])


def test_embed_takes_a_user_adjacency(tmp_path, capsys):
    adata = cape_adata(n_cells=20, n_genes=20)
    del adata.varp["cape_dag"]
    names = list(adata.var_names)
    # a chain over the first 5 genes, listed in reverse order: the reader reorders to var_names
    dag = pd.DataFrame(0.0, index=names[4::-1], columns=names[4::-1])
    for a, b in itertools.pairwise(names[:5]):
        dag.loc[a, b] = 1.0
    dag.to_csv(tmp_path / "chain.csv")
    out = tmp_path / "out.h5ad"
    proc = run(capsys, "embed", "-i", _write(tmp_path, adata, "in.h5ad"), "-o", str(out), "--epochs", "5",
               "--dim", "4", "--adjacency", str(tmp_path / "chain.csv"))
    assert proc.returncode == 0, proc.stderr
    result = ad.read_h5ad(out)
    assert result.varm["cape_poincare"].shape == (20, 4)
    assert int(result.var["cape_connected"].sum()) == 5
    # genes without an edge take part too (Eq. 16 negatives), those outside var["cape_used"] do not
    assert int(result.var["cape_embedded"].sum()) == int(result.var["cape_used"].sum())


# ----------------------------------------------------------------------------------------------- labels
def _labelled(kind: str) -> ad.AnnData:
    adata = cape_adata(n_cells=24)
    adata.obs["single"] = pd.Categorical(["t"] * adata.n_obs)
    if kind == "trained":
        adata.obsm["X_cape"] = np.random.default_rng(0).normal(size=(adata.n_obs, 4)).astype(np.float32)
    return adata


@pytest.mark.parametrize("label, words", [("nope", ["'nope'", "not found"]), ("single", ["'single'", "class"])])
def test_train_bad_label_key(tmp_path, capsys, label, words):
    out = tmp_path / "out.h5ad"
    proc = run(capsys, "train", "-i", _write(tmp_path, _labelled("plain"), "in.h5ad"), "-o", str(out),
               "--label-key", label, *TINY_MODEL)
    assert_refused(proc, *words, outputs=[out, tmp_path / "out_model"])


@pytest.mark.parametrize("label, words", [("nope", ["'nope'", "not found"]), ("single", ["'single'", "class"])])
def test_evaluate_bad_label_key(tmp_path, capsys, label, words):
    metrics, report = tmp_path / "m.json", tmp_path / "r.md"
    proc = run(capsys, "evaluate", "-i", _write(tmp_path, _labelled("trained"), "in.h5ad"), "--metrics",
               str(metrics), "--report", str(report), "--label-key", label)
    assert_refused(proc, *words, outputs=[metrics, report])


# ------------------------------------------------------------------------------------ preprocess / cells
def _counts(n_cells: int, n_genes: int = 60, kind: str = "poisson") -> ad.AnnData:
    rng = np.random.default_rng(0)
    if kind == "constant":
        x = np.full((n_cells, n_genes), 3.0)
    elif kind == "proportional":  # every cell the same profile at a different depth: constant once normalised
        x = np.outer(rng.integers(1, 6, n_cells), rng.integers(1, 10, n_genes)).astype(float)
    else:
        x = rng.poisson(3.0, size=(n_cells, n_genes)).astype(float)
    adata = ad.AnnData(x.astype(np.float32))
    adata.var_names = [f"G{i}" for i in range(n_genes)]
    adata.obs_names = [f"c{i}" for i in range(n_cells)]
    return adata


@pytest.mark.parametrize("n_cells, kind, extra, words", [
    (1, "poisson", [], ["has 1 cell", "at least 2 cells"]),
    (2, "poisson", [], ["the input has 2 cells", "at least 10 cells", "MIN_CELLS"]),
    (5, "poisson", [], ["the input has 5 cells", "at least 10 cells"]),
    (30, "poisson", ["--min-genes", "60"], ["remain after QC", "lower min_genes"]),
    (30, "constant", [], ["all 60 genes are constant"]),
    (30, "proportional", [], ["all 60 genes are constant", "after normalisation"]),
])
def test_preprocess_refuses_too_few_cells_and_constant_genes(tmp_path, capsys, n_cells, kind, extra, words):
    adata = _counts(n_cells, kind=kind)
    if extra:  # QC: only the first 3 cells have all 60 genes detected
        adata.X += 1
        adata.X[3:, :5] = 0
    out = tmp_path / "pp.h5ad"
    proc = run(capsys, "preprocess", "-i", _write(tmp_path, adata, "in.h5ad"), "-o", str(out),
               "--n-top-genes", "20", "--min-genes", "1", *extra)
    assert_refused(proc, *words, outputs=[out])


def test_preprocess_uses_only_varying_genes(tmp_path, capsys):
    adata = _counts(30)
    adata.X[:, :50] = 0.0  # 50 genes never detected: constant; 10 vary
    out = tmp_path / "pp.h5ad"
    proc = run(capsys, "preprocess", "-i", _write(tmp_path, adata, "in.h5ad"), "-o", str(out), "--n-top-genes",
               "20", "--min-genes", "1")
    assert proc.returncode == 0, proc.stderr
    used = ad.read_h5ad(out).var["cape_used"]
    assert used.sum() <= 10 and not used.iloc[:50].any()


def test_preprocess_uses_the_perturbed_genes_and_refuses_unknown_labels(tmp_path, capsys):
    adata = _counts(30)
    adata.obs["condition"] = ["ctrl"] * 20 + ["G3+ctrl"] * 10
    out = tmp_path / "pp.h5ad"
    args = ["preprocess", "-i", _write(tmp_path, adata, "in.h5ad"), "-o", str(out), "--n-top-genes", "5",
            "--min-genes", "1", "--interventions"]
    plain = tmp_path / "plain.h5ad"
    assert run(capsys, *args[:3], "-o", str(plain), *args[5:-1]).returncode == 0
    proc = run(capsys, *args, "condition")
    assert proc.returncode == 0, proc.stderr
    assert ad.read_h5ad(out).var.loc["G3", "cape_used"] and not ad.read_h5ad(plain).var.loc["G3", "cape_used"]
    out.unlink()
    assert_refused(run(capsys, *args, "perturbation"), "interventions='perturbation'", "no such column",
                   outputs=[out])


def test_causal_refuses_fewer_cells_than_step1_minimum(tmp_path, capsys):
    from cape.causal import MIN_CELLS

    out = tmp_path / "c.h5ad"
    proc = run(capsys, "causal", "-i", _write(tmp_path, cape_adata(n_cells=MIN_CELLS - 1), "in.h5ad"),
               "-o", str(out), "--epochs", "1")
    assert_refused(proc, f"at least {MIN_CELLS} cells", f"got {MIN_CELLS - 1}", outputs=[out])


def test_causal_refuses_an_unknown_interventions_column(tmp_path, capsys):
    out = tmp_path / "c.h5ad"
    proc = run(capsys, "causal", "-i", _write(tmp_path, cape_adata(), "in.h5ad"), "-o", str(out), "--epochs", "1",
               "--interventions", "perturbation")
    assert_refused(proc, "interventions='perturbation'", "no such column in adata.obs", outputs=[out])


# -------------------------------------------------------------------------- trained models and checkpoints
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny trained run: (h5ad with X_cape and predictions, model folder)."""
    folder = tmp_path_factory.mktemp("trained")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cape_adata(n_cells=30).write_h5ad(folder / "in.h5ad")
        assert main(["--quiet", "--threads", "1", "train", "-i", str(folder / "in.h5ad"), "-o",
                     str(folder / "run.h5ad"), "--label-key", "cell_type", *TINY_MODEL]) == 0
    finally:
        torch.set_num_threads(n)
    return folder / "run.h5ad", folder / "run_model"


def _damage(model: Path, tmp_path: Path, how: str) -> Path:
    import shutil

    copy = tmp_path / "model"
    shutil.copytree(model, copy)
    if how == "config_json":
        (copy / "config.json").write_text("{ not json")
    elif how == "config_keys":
        (copy / "config.json").write_text(json.dumps({"architecture": "scgpt"}))
    elif how == "weights_garbage":
        (copy / "model.pt").write_bytes(b"\x80\x04garbage")
    elif how == "weights_other_model":
        state = torch.load(copy / "model.pt", weights_only=True)
        state = {k: v[..., :1] if v.ndim else v for k, v in state.items()}
        torch.save(state, copy / "model.pt")
    elif how == "vocab":
        (copy / "vocab.json").write_text("[1, 2")
    elif how == "no_weights":
        (copy / "model.pt").unlink()
    return copy


@pytest.mark.parametrize("how, words", [
    ("config_json", ["damaged cape model directory", "JSONDecodeError"]),
    ("config_keys", ["damaged cape model directory", "KeyError"]),
    ("weights_garbage", ["damaged cape model directory"]),
    ("weights_other_model", ["damaged cape model directory"]),
    ("vocab", ["cannot read the gene vocabulary"]),
    ("no_weights", ["is not a cape model directory"]),
])
def test_evaluate_corrupt_model_directory(trained, tmp_path, capsys, how, words):
    h5ad, model = trained
    model = _damage(model, tmp_path, how)
    metrics, report = tmp_path / "m.json", tmp_path / "r.md"
    proc = run(capsys, "evaluate", "-i", str(h5ad), "--model", str(model), "--metrics", str(metrics),
               "--report", str(report), "--label-key", "cell_type")
    assert_refused(proc, *words, outputs=[metrics, report])
    with pytest.raises(cape.CapeInputError, match=words[0]):
        cape.models.CellTransformer.load(model, device="cpu")


def test_evaluate_vocabulary_mismatch(trained, tmp_path, capsys):
    h5ad, model = trained
    other = ad.read_h5ad(h5ad)
    other = other[:, 3:].copy()  # three of the model's genes missing
    metrics, report = tmp_path / "m.json", tmp_path / "r.md"
    proc = run(capsys, "evaluate", "-i", _write(tmp_path, other, "other.h5ad"), "--model", str(model),
               "--metrics", str(metrics), "--report", str(report), "--label-key", "cell_type")
    assert_refused(proc, "gene vocabulary mismatch", "3 of the model's", outputs=[metrics, report])


def _scgpt_checkpoint(folder: Path) -> Path:
    from test_models_scgpt_checkpoint import _write as write_checkpoint

    folder.mkdir()
    write_checkpoint(folder, "in_proj")
    return folder


def _checkpoint_data(tmp_path: Path) -> str:
    adata = cape_adata(n_cells=24, n_genes=12)
    adata.var_names = [f"G{i}" for i in range(10)] + ["OTHER1", "OTHER2"]
    return _write(tmp_path, adata, "in.h5ad")


@pytest.mark.parametrize("damage, extra, words", [
    ("missing", [], ["--checkpoint folder not found"]),
    ("args_json", [], ["cannot read", "args.json", "JSONDecodeError"]),
    ("weights", [], ["cannot read the weights", "best_model.pt"]),
    ("vocab", [], ["cannot read the gene vocabulary"]),
    ("no_vocab", [], ["lacks vocab.json"]),
    ("none", ["--architecture", "scbert"], ["--architecture scbert does not apply"]),
])
def test_train_bad_checkpoint(tmp_path, capsys, damage, extra, words):
    ckpt = tmp_path / "ckpt"
    if damage != "missing":
        _scgpt_checkpoint(ckpt)
    if damage == "args_json":
        (ckpt / "args.json").write_text("{")
    elif damage == "weights":
        (ckpt / "best_model.pt").write_bytes(b"PK\x03\x04 truncated")
    elif damage == "vocab":
        (ckpt / "vocab.json").write_text("not json")
    elif damage == "no_vocab":
        (ckpt / "vocab.json").unlink()
    out = tmp_path / "out.h5ad"
    proc = run(capsys, "train", "-i", _checkpoint_data(tmp_path), "-o", str(out), "--checkpoint", str(ckpt),
               "--label-key", "cell_type", *TINY_MODEL, *extra)
    assert_refused(proc, *words, outputs=[out, tmp_path / "out_model"])


def test_train_from_checkpoint_writes_model_and_predictions(tmp_path, capsys):
    ckpt = _scgpt_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "out.h5ad"
    proc = run(capsys, "train", "-i", _checkpoint_data(tmp_path), "-o", str(out), "--checkpoint", str(ckpt),
               "--label-key", "cell_type", "--encoding", "cape", "--max-len", "16", "--epochs", "2",
               "--pretrain-epochs", "1", "--batch-size", "8")
    assert proc.returncode == 0, proc.stderr
    result = ad.read_h5ad(out)
    assert result.obsm["X_cape"].shape == (24, 16)  # the checkpoint's d_model, not --d-model's default 64
    assert set(result.obs["cape_cell_type_prediction"]) <= {"t", "b", "nk"}
    model = cape.models.CellTransformer.load(tmp_path / "out_model", ad.read_h5ad(out), device="cpu")
    assert model.vocab.tokens[:10] == [f"G{i}" for i in range(10)]  # the checkpoint's vocabulary
    assert model.backbone.encoding_name == "cape"
    assert set(model.history) == {"pretrain", "train"}


@pytest.mark.parametrize("rank", ["0", "-3", "low"])
def test_causal_refuses_a_rank_that_is_no_rank(tmp_path, capsys, rank):
    adata = ad.AnnData(np.abs(np.random.default_rng(0).normal(size=(40, 4))).astype(np.float32))
    adata.var_names = list("abcd")
    out = tmp_path / "out.h5ad"
    proc = run(capsys, "causal", "-i", _write(tmp_path, adata, "in.h5ad"), "-o", str(out), "--rank", rank)
    assert_refused(proc, "--rank", "positive integer", "'dense'", outputs=[out])
