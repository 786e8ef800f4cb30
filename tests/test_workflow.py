"""The Snakemake workflow, run on copies of the workflow files in a temporary folder."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import anndata as ad
import pytest
from _workflow import snakemake


def test_dry_run_prints_the_plan(workdir):
    proc = snakemake(workdir, "-n")
    assert proc.returncode == 0, proc.stderr
    assert "preprocess" in proc.stdout
    assert "results/pbmc68k_reduced/preprocessed.h5ad" in proc.stdout


def test_dry_run_of_the_perturbation_mode(workdir):
    """perturbations=KEY: preprocessing keeps the perturbed genes, then `cape perturb` instead of Steps I–III."""
    import cape

    cape.data.simulate_perturbation(n_genes=12, n_edges=15, n_single=4, n_double=3, seed=0).write_h5ad(
        workdir / "screen.h5ad")
    proc = snakemake(workdir, "-n", "-p", "--config", "input=screen.h5ad", "perturbations=condition")
    assert proc.returncode == 0, proc.stderr
    assert "rule perturb" in proc.stdout and "rule train" not in proc.stdout
    assert "results/screen/perturbation/metrics.json" in proc.stdout
    assert "--interventions condition" in proc.stdout and "--transformer" in proc.stdout


def test_dry_run_of_the_norman2019_configuration(workdir):
    """The ready configuration for Norman et al. 2019 (CRISPRa): the dataset is fetched by the preprocess rule, and
    the Step I predictors set each target to its training level rather than knocking it out."""
    proc = snakemake(workdir, "-n", "-p", "--configfile", "configs/perturbation_norman2019.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "--input dataset:norman2019" in proc.stdout and "--interventions condition" in proc.stdout
    assert "rule perturb" in proc.stdout and "--target-value training" in proc.stdout
    assert "results/norman2019/perturbation/report.md" in proc.stdout


def test_perturbation_mode_runs_then_html_report(workdir):
    """The perturbation mode end to end on a tiny screen, then `snakemake --report` with its outputs."""
    import cape

    cape.data.simulate_perturbation(n_genes=16, n_edges=20, n_control=150, n_cells_per_perturbation=10,
                                    n_single=5, n_double=5, seed=0).write_h5ad(workdir / "screen.h5ad")
    config = ["--config", "input=screen.h5ad", "perturbations=condition", "preprocess={'min_genes': 0}",
              "perturb={'causal_epochs': 3, 'transformer': False, 'cell_eval': False, 'gears': False, 'n_boot': 50}"]
    proc = snakemake(workdir, "--cores", "2", *config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = workdir / "results/screen/perturbation"
    assert (out / "report.md").read_text().startswith("# cape perturbation run: screen")
    proc = snakemake(workdir, *config, "--report", "report.html")
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = (workdir / "report.html").read_text()
    items = {Path(path).name: entry for path, entry in _report_items(html).items()}
    assert {"report.md", "shifts.png", "metrics.json", "per_perturbation.tsv", "split.tsv"} <= set(items)
    assert "held out by GEARS" in items["shifts.png"]["caption"]
    assert "perturb" in html and "Perturbation prediction" in html


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
    assert (workdir / "logs/mydata/preprocess.tsv").exists()


@pytest.mark.parametrize(
    "override, words",
    [
        ("inptu=x.h5ad", "unknown config key 'inptu'"),
        ("seed=abc", "config key 'seed' must be of type integer"),
        ("preprocess={'min_gnes': 3}", "unknown config key 'preprocess.min_gnes'"),
        ("input=does/not/exist.h5ad", "input file not found: does/not/exist.h5ad"),
        ("train={'dropuot': 0.1}", "unknown config key 'train.dropuot'"),
        ("train={'checkpoint': 'no/such/folder'}", "train.checkpoint folder not found: no/such/folder"),
    ],
)
def test_bad_config_names_the_key(workdir, override, words):
    proc = snakemake(workdir, "-n", "--config", override)
    assert proc.returncode != 0
    assert words in proc.stdout + proc.stderr
    assert not (workdir / "results").exists()


@pytest.mark.parametrize("override, words", [
    ("labels=celltype", "labels=celltype: no such column in mine.h5ad; its cell annotation columns: group"),
    ("causal={'interventions': 'condition'}", "causal.interventions=condition: no such column"),
    ("perturbations=condition", "perturbations=condition: no such column"),
])
def test_missing_obs_column_is_named_before_any_job(workdir, counts_adata, override, words):
    counts_adata.write_h5ad(workdir / "mine.h5ad")
    proc = snakemake(workdir, "-n", "--config", "input=mine.h5ad", override)
    assert proc.returncode != 0 and words in proc.stdout + proc.stderr
    assert not (workdir / "results").exists()


def test_an_existing_obs_column_passes_and_an_unsupported_file_type_is_named(workdir, counts_adata):
    counts_adata.write_h5ad(workdir / "mine.h5ad")
    assert snakemake(workdir, "-n", "--config", "input=mine.h5ad", "labels=group").returncode == 0
    (workdir / "mine.txt").write_text("x")
    proc = snakemake(workdir, "-n", "--config", "input=mine.txt")
    assert proc.returncode != 0 and "unsupported file type .txt" in proc.stdout + proc.stderr


def test_bad_input_file_fails_without_partial_output(workdir):
    bad = workdir / "broken.h5ad"
    bad.write_text("not hdf5\n")
    proc = snakemake(workdir, "--cores", "1", "--config", f"input={bad}")
    assert proc.returncode != 0
    log = (workdir / "logs/broken/preprocess.log").read_text()
    assert log.strip().splitlines() == [log.strip()] and "cape: error: cannot read" in log
    assert not (workdir / "results/broken/preprocessed.h5ad").exists()
    # the rule repeats the error line on the terminal, where Snakemake shows only that the job failed
    assert log.strip() in proc.stderr.splitlines()


# A run small enough for the test suite: 30 genes, few epochs, a model that fits them (8 rotary planes).
TINY = ["preprocess={'n_top_genes': 30, 'min_genes': 200}", "causal={'epochs': 10, 'tau': 0.01}",
        "embed={'epochs': 50, 'dim': 8}",
        "train={'epochs': 2, 'd_model': 16, 'n_layers': 1, 'n_heads': 2, 'max_len': 32, 'batch_size': 64}"]


def _report_items(html: str) -> dict:
    """The files Snakemake embedded in its report: path → entry (name, mime type, base64 data URI, ...)."""
    match = re.search(r'<script id="results">\s*var results = (.*?);\s*</script>', html, re.S)
    assert match, "no results in the HTML report"
    return json.loads(match.group(1))


def test_tiny_run_then_html_report(workdir, counts_adata):
    """The whole workflow on 300 cells × 30 genes, then `snakemake --report` with the figures and tables."""
    data = workdir / "tiny.h5ad"
    counts_adata.write_h5ad(data)
    config = ["--config", f"input={data}", "labels=group", *TINY]
    proc = snakemake(workdir, "--cores", "2", *config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (workdir / "results/tiny/report.md").read_text()
    assert report.startswith("# cape run: tiny\n\n\n## Verdict\n\n")
    assert "Snakemake benchmark" in report and "| evaluate |" in report
    for stage in ("preprocess", "causal", "embed", "encode", "train", "evaluate"):
        assert (workdir / f"logs/tiny/{stage}.tsv").exists()

    proc = snakemake(workdir, *config, "--report", "report.html")
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = (workdir / "report.html").read_text()
    items = {Path(path).name: entry for path, entry in _report_items(html).items()}
    assert {"dag.png", "poincare.png", "cells.png", "verdict.html", "metrics.html", "metrics.json"} <= set(items)
    for name in ("dag.png", "poincare.png"):
        assert items[name]["mime_type"] == "image/png"
        assert base64.b64decode(items[name]["data_uri"].split("base64,", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "causal gene graph" in items["dag.png"]["caption"] and "Poincaré disk" in items["poincare.png"]["caption"]
    tables = base64.b64decode(items["metrics.html"]["data_uri"].split("base64,", 1)[1]).decode()
    assert "<table>" in tables and "<td>logreg_pca</td>" in tables and "<td>pca_kmeans</td>" in tables
    verdict = base64.b64decode(items["verdict.html"]["data_uri"].split("base64,", 1)[1]).decode()
    assert "got a position from the causal graph" in verdict and "peak memory" in verdict
    assert '"rule": "evaluate"' in html  # the workflow's rule graph
