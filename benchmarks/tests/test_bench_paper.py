"""Paper-scale benchmark configs (configs/benchmarks/paper_*.yaml): schema, dry run, the options they need on the
command line, and the run-time estimate's arithmetic."""

from __future__ import annotations

import json
import math
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import yaml
from _models_data import one_thread  # noqa: F401  (fixture)
from _workflow import REPO, snakemake
from hypothesis import given
from hypothesis import strategies as st

from cape.data.perturbation_data import simulate_perturbation
from cape.workflow_config import validate_config
from cape_benchmarks import encodings_models as bm
from cape_benchmarks import paper_runtime as pr
from cape_benchmarks.cli import main

PAPER_CONFIGS = sorted((REPO / "configs" / "benchmarks").glob("paper_*.yaml"))
SCHEMA = REPO / "configs" / "schema.yaml"


def _copy_workflow(tmp_path):
    for item in ("Snakefile", "workflows", "configs"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / item)


# ------------------------------------------------------------------------------------------------ the configs
def test_the_paper_tables_have_configs():
    names = {p.stem for p in PAPER_CONFIGS}
    assert {"paper_perturbation_norman2019_scgpt", "paper_perturbation_norman2019_scbert",
            "paper_ablation_norman2019", "paper_gears_norman2019", "paper_annotation_zheng68k_scgpt",
            "paper_annotation_zheng68k_scbert", "paper_annotation_segerstolpe_pancreas_scgpt",
            "paper_annotation_segerstolpe_pancreas_scbert", "paper_clustering_scope2_specht"} <= names


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_paper_config_is_valid_and_at_the_papers_sizes(path):
    config = yaml.safe_load(path.read_text())
    validate_config(config, SCHEMA)
    bench = config["benchmark"]
    assert bench["name"] == path.stem and config["device"] == "cuda"
    assert bench["causal_epochs"] == 100 and bench["embed_epochs"] == 1000  # Supp. F.4
    header = path.read_text().split("\ndevice:")[0]
    assert re.search(r"# Expected run time \(estimate", header), "the header states the estimated run time"
    if bench["task"] == "gears":
        assert bench["go_graph"].endswith("gene2go_all.pkl") and bench["embed_dim"] == 256
        return
    bm.variants(bench["encodings"])  # every name is known
    sizes = {"scgpt": (512, 4, 8, 5, 60), "scbert": (200, 6, 10, 3, 100)}[bench["backbones"][0]]
    epochs = bench.get("annotation_pretrain_epochs") or bench.get("pretrain_epochs")
    assert (bench["d_model"], bench["n_layers"], bench["n_heads"], bench["batch_size"], epochs) == sizes
    assert bench["lr"] == 1e-4 and bench["integrations"] == ["replace"]
    assert bench["n_genes"] == (3042 if bench["dataset"] == "scope2_specht" else 2000)
    assert bench["d_model"] % bench["n_heads"] == 0


def _dry_run(root, path):
    """A dry run of the paper config ``path`` in a copy of the workflow of its own under ``root``."""
    workdir = root / path.stem
    workdir.mkdir()
    _copy_workflow(workdir)
    return workdir, snakemake(workdir, "-n", "-p", "--cores", "4", "--configfile", str(path.relative_to(REPO)))


def test_paper_configs_dry_run_without_downloading(tmp_path):
    # Two dry runs at a time, each in its own copy: Snakemake's start-up is most of a dry run, and one core idles
    # while the other parses the workflow.
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(lambda path: _dry_run(tmp_path, path), PAPER_CONFIGS))
    for path, (workdir, proc) in zip(PAPER_CONFIGS, runs, strict=True):
        bench = yaml.safe_load(path.read_text())["benchmark"]
        assert proc.returncode == 0, (path.stem, proc.stderr[-2000:])
        assert f"results/bench/{path.stem}.json" in proc.stdout and "preprocess" not in proc.stdout
        command = next(line for line in proc.stdout.splitlines() if " -m cape_benchmarks " in line)
        assert "--device cuda" in command
        if bench["task"] == "gears":
            assert " gears --dataset norman2019" in command
            for flag in ("--go-graph resources/gears/gene2go_all.pkl", "--epochs 20", "--n-genes 2000",
                         "--embed-dim 256", "--seeds 0 1 2"):
                assert flag in command, flag
            assert "rule gears_gene2go" in proc.stdout and "dataverse.harvard.edu" in proc.stdout
        else:
            assert f" encodings --task {bench['task']} --dataset {bench['dataset']}" in command
            for key in ("d_model", "n_layers", "n_heads", "batch_size", "lr", "max_len", "n_genes"):
                assert f"--{key.replace('_', '-')} {bench[key]}" in command, key
            assert ("--annotation-pretrain-epochs" in command) == (bench["task"] == "annotation")
        assert not (workdir / "resources").exists() and not (workdir / "results").exists()


def test_gears_and_encodings_options_do_not_mix(tmp_path):
    _copy_workflow(tmp_path)
    proc = snakemake(tmp_path, "-n", "--cores", "1", "--config",
                     "benchmark={'task': 'gears', 'dataset': 'simulated', 'd_model': 64}")
    assert proc.returncode != 0 and "benchmark.d_model does not apply to task gears" in proc.stdout + proc.stderr
    proc = snakemake(tmp_path, "-n", "--cores", "1", "--config",
                     "benchmark={'task': 'perturbation', 'dataset': 'simulated', 'gears_epochs': 3}")
    message = "benchmark.gears_epochs does not apply to task perturbation"
    assert proc.returncode != 0 and message in proc.stdout + proc.stderr
    # a built-in graph needs no download
    proc = snakemake(tmp_path, "-n", "-p", "--cores", "1", "--config",
                     "benchmark={'task': 'gears', 'dataset': 'simulated', 'go_graph': 'known'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--go-graph known" in proc.stdout and "gears_gene2go" not in proc.stdout


def test_encodings_cli_passes_the_new_sizes_to_the_settings(monkeypatch, tmp_path):
    from cape_benchmarks.cli import encodings_command as cli_encodings

    seen = {}

    def fake(adata, task, **kwargs):
        seen["settings"] = kwargs["settings"]
        raise SystemExit(0)

    monkeypatch.setattr(cli_encodings, "run_encodings_benchmark", fake)
    with pytest.raises(SystemExit):
        main(["encodings", "--task", "perturbation", "--dataset", "simulated", "--quick", "--n-heads", "3",
              "--batch-size", "7", "--lr", "0.0002", "--annotation-pretrain-epochs", "4", "--out", str(tmp_path)])
    s = seen["settings"]
    assert (s.n_heads, s.batch_size, s.lr, s.annotation_pretrain_epochs) == (3, 7, 2e-4, 4)


def test_gears_cli_passes_steps_settings(monkeypatch, tmp_path):
    from cape_benchmarks.cli import gears_command as cli_gears

    seen = {}

    def fake(adata, **kwargs):
        seen.update(kwargs["settings_overrides"])
        raise SystemExit(0)

    monkeypatch.setattr(cli_gears, "run_gears_benchmark", fake)
    with pytest.raises(SystemExit):
        main(["gears", "--dataset", "simulated", "--quick", "--n-genes", "40", "--embed-dim", "6",
              "--embed-epochs", "9", "--out", str(tmp_path)])
    assert {k: seen[k] for k in ("n_genes", "embed_dim", "embed_epochs")} == {"n_genes": 40, "embed_dim": 6,
                                                                               "embed_epochs": 9}


# ------------------------------------------------------------------------------------------------ genes kept
def test_prepare_expression_keeps_every_perturbed_gene():
    pert = simulate_perturbation(n_genes=40, n_edges=60, n_control=60, n_cells_per_perturbation=6, n_single=12,
                                 n_double=6, seed=0)
    targets = {g for c in pert.obs["condition"].astype(str).unique() for g in c.split("+") if g != "ctrl"}
    kept = bm.prepare_expression(pert, 5)
    assert targets <= set(kept.var_names)
    assert kept.n_vars < pert.n_vars  # the rest is still cut to the most dispersed genes
    plain = pert.copy()
    del plain.obs["condition"]
    assert bm.prepare_expression(plain, 5).n_vars == 5


# ------------------------------------------------------------------------------------------------ estimate
@given(st.floats(0, 1), st.floats(0, 1e-2), st.floats(0, 1e-4))
def test_fit_recovers_a_quadratic_cost(a, b, c):
    tokens = [32, 64, 128, 256]
    fit = pr.fit_batch_seconds(tokens, [a + b * t + c * t * t for t in tokens])
    np.testing.assert_allclose(fit, (a, b, c), atol=1e-9)


def test_expected_seconds_arithmetic():
    cost = pr.TransformerCost(train=(1.0, 0.0, 0.0), forward=(0.25, 0.0, 0.0))  # seconds per batch
    bench = {"task": "annotation", "encodings": ["cape", "cape_wo_csl", "none"], "backbones": ["scgpt"],
             "integrations": ["replace"], "seeds": [0, 1], "batch_size": 10, "max_len": 100,
             "annotation_pretrain_epochs": 2, "fine_tune_epochs": 3, "causal_epochs": 4, "embed_epochs": 5}
    out = pr.expected_seconds(bench, cost, step1_per_cell_epoch=0.01, step2_per_epoch=2.0, cells=1000)
    pre = 2 * (90 * 1.0 + 10 * 0.25)  # 900 training cells, 100 validation cells, batches of 10
    tune = 3 * (24 * 1.0 + 6 * 0.25)  # 300 fine-tune cells: 240 train, 60 validation
    test = 70 * 0.25  # 700 test cells
    assert out["models"] == 6
    assert math.isclose(out["transformer"], 6 * (pre + tune + test))
    assert math.isclose(out["step_I"], 4 * 1000 * 0.01)  # Step I once (cape)
    assert math.isclose(out["step_II"], 2 * 5 * 2.0)  # Step II for cape and correlation
    assert math.isclose(out["total"], out["transformer"] + out["step_I"] + out["step_II"])
    pert = pr.expected_seconds({**bench, "task": "perturbation", "pretrain_epochs": 1}, cost, 0.01, 2.0, 1000,
                               control_cells=100)
    assert math.isclose(pert["transformer"], 6 * ((9 * 1.0 + 1 * 0.25) + 10 * 0.25))
    assert math.isclose(pert["step_I"], 4 * 100 * 0.01)  # Step I learns on the control cells


def test_paper_runtime_command_measures_and_writes(tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({"benchmark": {
        "task": "clustering", "dataset": "scope2_specht", "encodings": ["cape"], "backbones": ["scgpt"],
        "integrations": ["replace"], "seeds": [0], "d_model": 8, "n_layers": 1, "n_heads": 2, "batch_size": 4,
        "max_len": 32, "n_genes": 12, "pretrain_epochs": 1, "causal_epochs": 2, "embed_epochs": 3}}))
    assert main(["--quiet", "paper-runtime", str(config), "--tokens", "4", "8", "12", "--steps", "1",
                 "--cells", "16", "--out", str(tmp_path / "out")]) == 0
    records = json.loads((tmp_path / "out" / "paper_runtime.json").read_text())
    estimate = next(r for r in records if r["kind"] == "estimate")
    assert estimate["config"] == "tiny" and estimate["models"] == 1 and estimate["total"] > 0
    assert {r["kind"] for r in records} == {"estimate", "measurement", "machine"}
    assert "GPU times are not measured" in (tmp_path / "out" / "paper_runtime.md").read_text()
    assert main(["paper-runtime", str(tmp_path / "nope.yaml")]) == 2
    assert "config not found" in capsys.readouterr().err
    config.write_text(yaml.safe_dump({"benchmark": {"task": "clustering", "dataset": "pbmc3k"}}))
    assert main(["paper-runtime", str(config)]) == 2
    assert "has no known size" in capsys.readouterr().err
