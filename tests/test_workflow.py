"""The Snakemake workflow, run on copies of the workflow files in a temporary folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import anndata as ad
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def workdir(tmp_path) -> Path:
    shutil.copy(REPO / "Snakefile", tmp_path / "Snakefile")
    shutil.copytree(REPO / "workflows", tmp_path / "workflows")
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    return tmp_path


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=workdir, capture_output=True, text=True,
                          check=False)


def test_dry_run_prints_the_plan(workdir):
    proc = snakemake(workdir, "-n")
    assert proc.returncode == 0, proc.stderr
    assert "preprocess" in proc.stdout
    assert "results/pbmc68k_reduced/preprocessed.h5ad" in proc.stdout


def test_lint_reports_only_missing_environments(workdir):
    proc = snakemake(workdir, "--lint")
    text = proc.stdout + proc.stderr
    lints = {line.strip() for line in text.splitlines() if line.strip().startswith("* ")}
    assert lints <= {"* Specify a conda environment or container for each rule.:"}, text


def test_run_on_user_h5ad(workdir, counts_adata):
    data = workdir / "mydata.h5ad"
    counts_adata.write_h5ad(data)
    target = "results/mydata/preprocessed.h5ad"
    proc = snakemake(workdir, target, "--cores", "2", "--config", f"input={data}",
                     "preprocess={'n_top_genes': 25, 'min_genes': 200}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = ad.read_h5ad(workdir / target)
    assert out.var["cape_used"].sum() == 25
    assert (workdir / "logs/mydata/preprocess.log").exists()
    assert (workdir / "benchmarks/mydata/preprocess.tsv").exists()


@pytest.mark.parametrize(
    "override, words",
    [
        ("inptu=x.h5ad", "unknown config key 'inptu'"),
        ("seed=abc", "config key 'seed' must be of type integer"),
        ("preprocess={'min_gnes': 3}", "unknown config key 'preprocess.min_gnes'"),
        ("input=does/not/exist.h5ad", "input file not found: does/not/exist.h5ad"),
    ],
)
def test_bad_config_names_the_key(workdir, override, words):
    proc = snakemake(workdir, "-n", "--config", override)
    assert proc.returncode != 0
    assert words in proc.stdout + proc.stderr
    assert not (workdir / "results").exists()


def test_bad_input_file_fails_without_partial_output(workdir):
    bad = workdir / "broken.h5ad"
    bad.write_text("not hdf5\n")
    proc = snakemake(workdir, "--cores", "1", "--config", f"input={bad}")
    assert proc.returncode != 0
    log = (workdir / "logs/broken/preprocess.log").read_text()
    assert log.strip().splitlines() == [log.strip()] and "cape: error: cannot read" in log
    assert not (workdir / "results/broken/preprocessed.h5ad").exists()
