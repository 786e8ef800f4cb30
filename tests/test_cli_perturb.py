"""``cape perturb`` (the workflow's perturbation mode): end to end on a tiny simulated Perturb-seq file, no held-out
perturbation reaching a fit, and each bad input refused in one line with nothing written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from _models_data import one_thread  # noqa: F401  (fixture)

import cape
from cape.cli import main
from cape.cli.perturb_command import OUTPUTS
from cape.tasks.perturbation_gears import gears_available
from cape.tasks.perturbation_workflow import PerturbationSettings, perturbation_data, run_perturbation_workflow

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = ["--causal-epochs", "5", "--pretrain-epochs", "1", "--embed-epochs", "20", "--predictor-epochs", "20",
        "--n-boot", "50", "--d-model", "16", "--embed-dim", "4", "--gears-epochs", "1"]
BASE_PREDICTORS = {"no_change", "train_mean", "additive", "linear", "scm_control", "scm_interventional",
                   "scm_interventional_linear", "transformer"}


@pytest.fixture(scope="module")
def predictors() -> set[str]:
    """Every predictor the run scores: GEARS where it installs. Asked at test time, not at collection: importing
    GEARS compiles numba code, which a crash would turn into a worker lost before any test ran."""
    return BASE_PREDICTORS | ({"gears"} if gears_available() else set())


@pytest.fixture(scope="module")
def screen() -> ad.AnnData:
    """160 control cells and 14 perturbations of 12 cells on 20 genes."""
    return cape.data.simulate_perturbation(n_genes=20, n_edges=30, n_control=160, n_cells_per_perturbation=12,
                                           n_single=7, n_double=7, seed=0)


def run(capsys, *args: str) -> subprocess.CompletedProcess:
    try:
        code = main(["--quiet", "--device", "cpu", *args])
    except SystemExit as exit_:  # argparse usage errors
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


def test_perturb_writes_every_predictor_and_the_split(tmp_path, capsys, screen, predictors):
    src = tmp_path / "screen.h5ad"
    screen.write_h5ad(src)
    out = tmp_path / "out"
    proc = run(capsys, "perturb", "-i", str(src), "--out-dir", str(out), *FAST)
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in out.iterdir()} == set(OUTPUTS)
    records = json.loads((out / "metrics.json").read_text())
    scored = {r["method"] for r in records if r["task"] == "perturbation" and r["metric"] == "mse_overall"}
    assert scored == predictors
    assert any(r["task"] == "comparison" and r["metric"] == "low" for r in records)
    split = pd.read_csv(out / "split.tsv", sep="\t")
    test = set(split.loc[split["role"] == "test", "condition"])
    assert test and not test & set(split.loc[split["role"] != "test", "condition"])
    assert set(split.loc[split["role"] == "test", "subgroup"]) <= set(cape.tasks.perturbation.SUBGROUPS)
    per = pd.read_csv(out / "per_perturbation.tsv", sep="\t")
    assert set(per["condition"]) == test and set(per["predictor"]) == predictors
    report = (out / "report.md").read_text().splitlines()
    assert report[0].startswith("# cape perturbation run") and "top-20-DE MSE" in report[2]
    if cape.tasks.perturbation_cell_eval.cell_eval_available():  # the extra perturb: its metrics beside cape's
        assert "## cell-eval" in report and "cell_eval_pearson_delta" in per.columns
        assert {r["method"] for r in records if r["metric"] == "cell_eval_pearson_delta"} == predictors
        no_change = per.loc[per["predictor"] == "no_change", "cell_eval_pearson_delta"]
        assert np.all(no_change == 0)  # a prediction that does not move has no correlation with the change


def test_perturb_without_cell_eval_keeps_cape_scores_only(tmp_path, capsys, screen):
    src = tmp_path / "screen.h5ad"
    screen.write_h5ad(src)
    out = tmp_path / "out"
    proc = run(capsys, "perturb", "-i", str(src), "--out-dir", str(out), *FAST, "--no-cell-eval", "--no-transformer",
               "--gears", "false")
    assert proc.returncode == 0, proc.stderr
    per = pd.read_csv(out / "per_perturbation.tsv", sep="\t")
    assert "gears" not in set(per["predictor"])
    assert not [c for c in per.columns if c.startswith("cell_eval")]
    assert "## cell-eval" not in (out / "report.md").read_text()


def test_step1_fits_never_see_a_held_out_cell(screen):
    run_ = run_perturbation_workflow(perturbation_data(screen, "condition"),
                                     PerturbationSettings(causal_epochs=3, transformer=False, gears_epochs=1))
    labels = screen.obs["condition"].astype(str)
    test_cells = set(screen.obs_names[labels.isin(run_.task.split.test)])
    train_cells = set(screen.obs_names[labels.isin(run_.task.train)])
    control_cells = set(screen.obs_names[labels == "ctrl"])
    interventional = set(run_.fitted_cells["scm_interventional"])
    assert not interventional & test_cells
    assert interventional == control_cells | train_cells  # the training perturbations are used, as interventions
    assert set(run_.fitted_cells["scm_control"]) == control_cells
    if gears_available():  # GEARS reads the control cells and the training perturbations only, too
        assert set(run_.fitted_cells["gears"]) == control_cells | train_cells
    assert np.isfinite(run_.per_perturbation["top_de_mse"]).all()


def _relabel(screen: ad.AnnData, kind: str) -> ad.AnnData:
    data = screen.copy()
    labels = data.obs["condition"].astype(str)
    first = sorted(set(labels) - {"ctrl"})[0]
    if kind == "spelling":
        data.obs["condition"] = labels.replace({first: "sgRNA_7"}).to_numpy()
    elif kind == "gene":
        data.obs["condition"] = labels.replace({first: "NOTAGENE+ctrl"}).to_numpy()
    elif kind == "control":
        data = data[labels.to_numpy() != "ctrl"].copy()
    elif kind == "single":
        data = data[labels.isin(["ctrl", first]).to_numpy()].copy()
    return data


@pytest.mark.parametrize("kind, option, words", [
    ("spelling", "condition", "'sgRNA_7' (" ),
    ("gene", "condition", "absent from the matrix, e.g. NOTAGENE"),
    ("control", "condition", "no control cells"),
    ("single", "condition", "1 perturbation(s) besides control"),
    ("none", "guide", "perturbations='guide': no such column"),
])
def test_bad_perturbation_input_is_one_line_and_writes_nothing(tmp_path, capsys, screen, kind, option, words):
    src = tmp_path / "in.h5ad"
    _relabel(screen, kind).write_h5ad(src)
    out = tmp_path / "out"
    proc = run(capsys, "perturb", "-i", str(src), "--perturbations", option, "--out-dir", str(out), *FAST)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cape: error: ") and words in lines[0], proc.stderr
    assert not out.exists()


def test_other_spellings_are_converted(tmp_path, screen):
    data = screen.copy()
    labels = data.obs["condition"].astype(str)
    data.obs["perturbation"] = (labels.str.replace("+ctrl", "", regex=False).str.replace("+", "_", regex=False)
                                .replace({"ctrl": "non-targeting"}).to_numpy())
    converted = perturbation_data(data, "perturbation").obs["condition"]
    assert (converted.to_numpy() == labels.to_numpy()).all()


def test_preprocess_keeps_perturbed_genes_and_converts_labels(tmp_path, capsys, screen):
    data = screen.copy()
    data.obs["condition"] = data.obs["condition"].astype(str).replace({"ctrl": "non-targeting"}).to_numpy()
    src, dst = tmp_path / "in.h5ad", tmp_path / "pre.h5ad"
    data.write_h5ad(src)
    proc = run(capsys, "preprocess", "-i", str(src), "-o", str(dst), "--min-genes", "0", "--n-top-genes", "5",
               "--interventions", "condition")
    assert proc.returncode == 0, proc.stderr
    pre = ad.read_h5ad(dst)
    assert "ctrl" in set(pre.obs["condition"]) and "non-targeting" not in set(pre.obs["condition"])
    targets = {g for c in set(pre.obs["condition"]) - {"ctrl"} for g in cape.tasks.perturbation.condition_genes(c)}
    assert targets <= set(pre.var_names[pre.var["cape_used"].to_numpy(bool)])


def test_perturb_help_lists_the_command(capsys):
    proc = run(capsys, "--help")
    assert "perturb" in proc.stdout
    assert Path(cape.cli.perturb_command.__file__).name == "perturb_command.py"
