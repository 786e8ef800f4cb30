"""``cape-bench encodings``: variants and ablation wiring, records and tables, bad input, the CLI and the
benchmark configs (tiny data, 1 epoch)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import anndata as ad
import networkx as nx
import numpy as np
import pandas as pd
import pytest
from _models_data import one_thread  # noqa: F401  (fixture)
from hypothesis import given, settings
from hypothesis import strategies as st

import cape
from cape import CapeInputError
from cape.data.perturbation_data import simulate_perturbation
from cape_benchmarks import encodings as be
from cape_benchmarks import encodings_models as bm
from cape_benchmarks import encodings_report as br

REPO = Path(__file__).resolve().parents[2]
TINY = bm.BenchSettings(n_genes=24, d_model=8, n_layers=1, n_heads=2, max_len=16, batch_size=16, pretrain_epochs=1,
                        fine_tune_epochs=1, patience=1, causal_epochs=2, causal_tau=0.01, causal_rank=4, embed_dim=4,
                        embed_epochs=10, corr_neighbors=3, predictor_epochs=3)


pytestmark = pytest.mark.usefixtures("one_thread")  # shared fixture from _models_data


@pytest.fixture(scope="module")
def labelled() -> ad.AnnData:
    """90 cells × 30 genes of log counts in 3 groups of 30 (each group raises its own 6 genes)."""
    rng = np.random.default_rng(0)
    x = rng.poisson(1.0, size=(90, 30)).astype(np.float32)
    for g in range(3):
        x[30 * g:30 * (g + 1), 6 * g:6 * (g + 1)] += rng.poisson(4.0, size=(30, 6))
    adata = ad.AnnData(np.log1p(x))
    adata.obs_names = [f"c{i}" for i in range(90)]
    adata.var_names = [f"G{i}" for i in range(30)]
    adata.obs["cell_type"] = pd.Categorical(np.repeat(["a", "b", "c"], 30))
    return adata


@pytest.fixture(scope="module")
def perturbed() -> ad.AnnData:
    return simulate_perturbation(n_genes=16, n_edges=24, n_control=60, n_cells_per_perturbation=8, n_single=10,
                                 n_double=10, seed=0)


# ------------------------------------------------------------------------------------------------------ variants
def test_variants_map_ablations_to_encoding_and_positions():
    rows = {v.name: v for v in bm.variants()}
    assert set(rows) == {*cape.encodings.available(), *bm.ABLATIONS}
    assert (rows["cape_null"].encoding, rows["cape_null"].positions) == ("none", "none")
    assert (rows["cape_wo_csl"].encoding, rows["cape_wo_csl"].positions) == ("cape", "correlation")
    assert (rows["cape_wo_hyperbolic"].encoding, rows["cape_wo_hyperbolic"].positions) == ("cape", "euclidean")
    assert (rows["cape_wo_rotary"].encoding, rows["cape_wo_rotary"].positions) == ("cape_additive", "cape")
    assert (rows["cape"].encoding, rows["cape"].positions) == ("cape", "cape")
    assert rows["rope"].positions == "cape"  # DAG order from Step I
    assert rows["trainable_absolute"].positions == "none"
    assert rows["static_absolute"].positions == "none"  # co-expression vectors, no Steps I-III


def test_unknown_encoding_lists_the_available_ones():
    with pytest.raises(CapeInputError, match="unknown encoding.*cape_wo_rotari.*available:.*cape_wo_csl"):
        bm.variants(["cape", "cape_wo_rotari"])


def test_embed_dim_defaults_to_half_the_model_width():
    assert bm.BenchSettings().embed_dim == bm.BenchSettings().d_model // 2  # the paper's d = D/2
    quick = bm.BenchSettings.for_mode(True)
    assert quick.embed_dim == quick.d_model // 2
    assert bm.BenchSettings.for_mode(True, d_model=48).embed_dim == 24
    assert bm.BenchSettings.for_mode(True, d_model=48, embed_dim=8).embed_dim == 8


# ------------------------------------------------------------------------------------------- correlation graph
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 4))
def test_correlation_graph_is_an_oriented_knn_similarity_graph(seed, k):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(40, 9)) @ rng.normal(size=(9, 9))
    graph = bm.correlation_graph(x, k=k).toarray()
    assert nx.is_directed_acyclic_graph(nx.from_numpy_array(graph, create_using=nx.DiGraph))
    corr = np.abs(np.corrcoef(x.T))
    np.fill_diagonal(corr, 0)
    skeleton = np.maximum(graph, graph.T)
    # brute force: i–j is an edge iff j is among i's k most correlated genes or i among j's
    top = np.zeros_like(corr, dtype=bool)
    for i in range(9):
        top[i, np.argsort(-corr[i])[:k]] = True
    np.testing.assert_array_equal(skeleton > 0, top | top.T)
    np.testing.assert_allclose(skeleton[skeleton > 0], corr[skeleton > 0], rtol=1e-10)
    assert not (graph * graph.T).any()  # each similarity edge appears in one direction only
    # correlation is invariant to a positive rescaling and shift of a gene
    x2 = x.copy()
    x2[:, 0] = 3.0 * x2[:, 0] + 1.0
    np.testing.assert_allclose(bm.correlation_graph(x2, k=k).toarray(), graph, atol=1e-12)


# -------------------------------------------------------------------------------------------- ablation wiring
def test_position_sets_use_the_intended_graph_and_geometry(labelled):
    data = bm.prepare_expression(labelled, TINY.n_genes)
    sets, timings = bm.position_sets(data, ["cape", "euclidean", "correlation"], TINY, seed=0, device="cpu")
    cape_set, eucl, corr = sets["cape"], sets["euclidean"], sets["correlation"]
    # w/o hyperbolic: the same Step I DAG, embedded in Euclidean space
    assert (cape_set.varp["cape_dag"] != eucl.varp["cape_dag"]).nnz == 0
    assert "cape_lorentz" in cape_set.varm and "cape_lorentz" not in eucl.varm and "cape_euclidean" in eucl.varm
    assert cape_set.uns["cape"]["hyperbolic_embedding"]["params"]["geometry"] == "hyperbolic"
    assert eucl.uns["cape"]["hyperbolic_embedding"]["params"]["geometry"] == "euclidean"
    # w/o CSL: the similarity graph, never stored as a causal DAG
    assert "cape_dag" not in corr.varp
    assert corr.uns["cape"]["hyperbolic_embedding"]["params"]["source"] == "adjacency argument"
    assert "causal_graph" not in corr.uns["cape"]
    for s in sets.values():
        np.testing.assert_allclose(s.varm["cape_angles"], math.pi / 4 * s.varm["cape_poincare"], rtol=1e-6)
    assert not np.allclose(corr.varm["cape_angles"], cape_set.varm["cape_angles"])
    steps = {(t["position_set"], t["step"], t["metric"]) for t in timings}
    assert ("cape", "I_causal_graph", "seconds") in steps and ("correlation", "I_correlation_graph", "n_edges") in steps


def test_models_read_the_intended_encoding_and_positions(labelled, tmp_path, monkeypatch):
    seen = {}
    real = bm.build_model

    def spy(data, backbone, variant, settings, seed, device=None, integration="complement"):
        model = real(data, backbone, variant, settings, seed, device, integration)
        seen[(backbone, variant.name)] = (model.backbone.encoding.__class__.__name__, set(data.varm), set(data.varp))
        return model

    monkeypatch.setattr(be, "build_model", spy)
    be.run_encodings_benchmark(labelled, "clustering", label_key="cell_type", settings=TINY, seeds=[0],
                               backbones=["scgpt"], out=None, integrations=["replace"],
                               encoding_names=["cape", "cape_null", "cape_wo_csl", "cape_wo_hyperbolic",
                                               "cape_wo_rotary"])
    cls = {k[1]: v[0] for k, v in seen.items()}
    assert cls == {"cape": "CapeEncoding", "cape_null": "NoPositionalEncoding", "cape_wo_csl": "CapeEncoding",
                   "cape_wo_hyperbolic": "CapeEncoding", "cape_wo_rotary": "CapeAdditiveEncoding"}
    assert "cape_lorentz" in seen[("scgpt", "cape")][1] and "cape_dag" in seen[("scgpt", "cape")][2]
    assert "cape_euclidean" in seen[("scgpt", "cape_wo_hyperbolic")][1]
    assert "cape_dag" not in seen[("scgpt", "cape_wo_csl")][2]
    assert "cape_angles" not in seen[("scgpt", "cape_null")][1]


# ------------------------------------------------------------------------------------------ records and tables
REQUIRED = {"task", "dataset", "backbone", "encoding", "seed", "metric", "value"}


def test_annotation_records_table_and_files(labelled, tmp_path):
    names = ["trainable_absolute", "static_absolute", "cape", "grape_a"]
    result = be.run_encodings_benchmark(labelled, "annotation", dataset="tiny", label_key="cell_type",
                                        encoding_names=names, seeds=[0, 1], settings=TINY, out=tmp_path)
    records = json.loads((tmp_path / "annotation_tiny.json").read_text())
    assert records == json.loads(json.dumps(result.records, default=float))
    assert all(REQUIRED <= set(r) for r in records)
    models = [r for r in records if r["kind"] == "model"]
    # every pair runs: 4 encodings × 2 backbones × 2 integrations; 2 seeds; accuracy + macro-F1
    assert len(models) == 4 * 2 * 2 * 2 * 2
    assert not [r for r in records if r["kind"] == "skipped"]
    assert {r["integration"] for r in models} == {"complement", "replace"}
    softmax = {(r["backbone"], r["encoding"]) for r in models if r["attention"] == "softmax"}
    assert ("scbert", "grape_a") in softmax and ("scbert", "cape") not in softmax  # Performer cannot add a bias
    assert all(0 <= r["value"] <= 1 for r in models)
    baseline = [r for r in records if r["kind"] == "baseline"]
    assert {(r["encoding"], r["seed"], r["metric"]) for r in baseline} == {
        ("logreg_pca50", s, m) for s in (0, 1) for m in ("accuracy", "macro_f1")}
    md = (tmp_path / "annotation_tiny.md").read_text()
    assert "| scgpt (complement) | trainable_absolute † |" in md and "| scbert (replace) | static_absolute † |" in md
    assert "| scbert (complement) | grape_a [softmax] |" in md
    main_table = md.split("## Paired differences")[0]
    table_rows = [line for line in main_table.splitlines() if line.startswith(("| scgpt", "| scbert"))]
    assert len(table_rows) == 16
    assert (tmp_path / "annotation_tiny.png").stat().st_size > 0


def test_table_shows_mean_sd_and_difference_to_each_backbone_default():
    recs = []
    for backbone, default in bm.DEFAULT_ENCODING.items():
        for seed, (d, c) in enumerate([(0.5, 0.6), (0.7, 0.8)]):
            recs += [{"kind": "model", "backbone": backbone, "encoding": default, "seed": seed, "metric": "accuracy",
                      "value": d},
                     {"kind": "model", "backbone": backbone, "encoding": "cape", "seed": seed, "metric": "accuracy",
                      "value": c + (0.1 if backbone == "scbert" else 0.0)}]
    recs.append({"kind": "baseline", "backbone": "baseline", "encoding": "logreg_pca50", "seed": 0,
                 "metric": "accuracy", "value": 0.55})
    table = br.results_table(recs, "annotation")
    sd = np.std([0.5, 0.7], ddof=1)
    assert f"| scgpt | trainable_absolute † | 0.600 ± {sd:.3f} |" in table
    assert f"| scgpt | cape | 0.700 ± {sd:.3f} (+0.100) |" in table
    assert f"| scbert | cape | 0.800 ± {sd:.3f} (+0.200) |" in table
    assert "| baseline | logreg_pca50 | 0.550 |" in table
    assert "macro_f1" not in table  # only measured metrics get a column


def test_clustering_and_perturbation_records(labelled, perturbed):
    clus = be.run_encodings_benchmark(labelled, "clustering", label_key="cell_type", settings=TINY, seeds=[0],
                                      backbones=["scbert"], encoding_names=["none"], out=None,
                                      integrations=["complement"]).records
    assert {r["metric"] for r in clus if r["kind"] == "model"} == {"ARI", "NMI", "ASW"}
    assert {r["encoding"] for r in clus if r["kind"] == "baseline"} == {"pca_kmeans"}
    pert = be.run_encodings_benchmark(perturbed, "perturbation", settings=TINY, seeds=[0], backbones=["scgpt"],
                                      encoding_names=["trainable_absolute", "cape"], out=None,
                                      integrations=["replace"]).records
    models = [r for r in pert if r["kind"] == "model"]
    assert {r["metric"] for r in models} <= set(bm.METRICS["perturbation"])
    assert {"mse_single", "mse_double", "mse_overall"} <= {r["metric"] for r in models}
    assert all(r["value"] >= 0 for r in models if not math.isnan(r["value"]))
    assert {r["encoding"] for r in pert if r["kind"] == "baseline"} == {
        "no_change", "train_mean", "additive", "linear", "embedding_pca", "control_constant", "control_permuted"}
    base = {(r["encoding"], r["metric"]): r["value"] for r in pert if r["kind"] == "baseline"}
    # the constant control is no change exactly; pearson_delta of a prediction without variation is 0
    assert base[("control_constant", "mse_single")] == pytest.approx(base[("no_change", "mse_single")])
    assert base[("control_constant", "pearson_delta_overall")] == 0.0
    # Steps I-III ran on control cells only (the cells the backbone is pretrained on)
    n_control = int((perturbed.obs["condition"] == "ctrl").sum())
    assert n_control < perturbed.n_obs
    assert any(r["kind"] == "positions" and r["metric"] == "n_edges" for r in pert)


def test_same_seed_same_records(labelled):
    kw = dict(label_key="cell_type", settings=TINY, seeds=[3], backbones=["scgpt"], encoding_names=["cape"],
              out=None, integrations=["complement"])
    a = be.run_encodings_benchmark(labelled, "clustering", **kw).records
    b = be.run_encodings_benchmark(labelled, "clustering", **kw).records

    def values(recs):
        return [(r["encoding"], r["metric"], r["value"]) for r in recs if r["kind"] in ("model", "baseline")]

    assert values(a) == values(b)


# ------------------------------------------------------------------------------------------------- bad input
def test_missing_label_key_is_named(labelled):
    with pytest.raises(CapeInputError, match=r"obs\['nope'\] not found"):
        be.run_encodings_benchmark(labelled, "annotation", label_key="nope", settings=TINY, out=None)
    with pytest.raises(CapeInputError, match="needs a label key"):
        be.run_encodings_benchmark(labelled, "clustering", label_key=None, settings=TINY, out=None)


@pytest.mark.parametrize("kwargs, words", [
    ({"task": "imputation"}, "unknown task"),
    ({"task": "clustering", "backbones": ["scfoundation"]}, "unknown backbone"),
    ({"task": "clustering", "seeds": []}, "at least one seed"),
])
def test_bad_arguments(labelled, kwargs, words):
    with pytest.raises(CapeInputError, match=words):
        be.run_encodings_benchmark(labelled, label_key="cell_type", settings=TINY, out=None, **kwargs)


def test_perturbation_without_control_cells(perturbed):
    bad = perturbed[perturbed.obs["condition"] != "ctrl"].copy()
    with pytest.raises(CapeInputError, match="no control cells"):
        be.run_encodings_benchmark(bad, "perturbation", settings=TINY, out=None)


# ---------------------------------------------------------------------------------------------------------- CLI
def test_cli_runs_and_rejects_unknown_encodings(labelled, tmp_path, capsys):
    from cape_benchmarks.cli import main

    path = tmp_path / "tiny.h5ad"
    labelled.write_h5ad(path)
    assert main(["--quiet", "encodings", "--task", "annotation", "--dataset", str(path),
                 "--encodings", "cape_null", "--backbones", "scgpt", "--label-key", "cell_type", "--seeds", "0",
                 "--out", str(tmp_path / "out"), "--n-genes", "24", "--d-model", "8", "--n-layers", "1",
                 "--max-len", "16", "--pretrain-epochs", "1", "--fine-tune-epochs", "1"]) == 0
    assert {p.name for p in (tmp_path / "out").iterdir()} == {f"annotation_tiny.{s}" for s in ("json", "md", "png")}
    code = main(["encodings", "--task", "annotation", "--dataset", str(path), "--encodings", "kape"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown encoding(s) kape; available:" in err and "Traceback" not in err
    code = main(["encodings", "--task", "clustering", "--dataset", str(path)])
    assert code == 2 and "pass --label-key" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ workflow
def test_benchmark_configs_dry_run(tmp_path):
    for item in ("Snakefile", "workflows", "configs"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / item)
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--cores", "4", "--configfile",
                           "configs/benchmarks/ablation_perturbation_simulated.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "bench_encodings" in proc.stdout
    assert "--threads 1 --jobs 2" in proc.stdout  # the schema's defaults: two models at once, one thread each
    assert "results/bench/ablation_perturbation_simulated.json" in proc.stdout
    assert "preprocess" not in proc.stdout  # a benchmark config runs the table, not the default pipeline


def test_every_benchmark_config_names_a_valid_run():
    import yaml

    expected = {"annotation_pbmc68k_reduced", "clustering_pbmc68k_reduced", "clustering_krumsiek11",
                "perturbation_simulated", "perturbation_sachs2005", "ablation_perturbation_simulated",
                *(f"oracle_{task}_simulated_grn" for task in bm.TASKS)}
    configs = {p.stem: yaml.safe_load(p.read_text()) for p in (REPO / "configs/benchmarks").glob("*.yaml")}
    assert expected <= set(configs)
    for name in expected:
        bench = configs[name]["benchmark"]
        assert bench["task"] in bm.TASKS
        bm.variants(bench.get("encodings"))  # every name is known
        assert set(bench.get("backbones", bm.BACKBONES)) <= set(bm.BACKBONES)
        assert len(bench.get("seeds", [0, 1, 2])) >= 3
    assert all(len(configs[f"oracle_{task}_simulated_grn"]["benchmark"]["seeds"]) >= 10 for task in bm.TASKS)


def test_an_encoding_that_cannot_be_built_is_reported_and_the_rest_runs(labelled):
    # 2 heads of width 4 hold 4 rotary planes, fewer than 6 Step II coordinates
    wide = replace(TINY, embed_dim=6)
    records = be.run_encodings_benchmark(labelled, "clustering", label_key="cell_type", settings=wide, seeds=[0, 1],
                                         backbones=["scgpt"], encoding_names=["cape", "none"], out=None,
                                         integrations=["complement"]).records
    skipped = [r for r in records if r["kind"] == "skipped"]
    assert [(r["encoding"], "rotary planes" in r["reason"]) for r in skipped] == [("cape", True)]
    assert {r["encoding"] for r in records if r["kind"] == "model"} == {"none"}
    assert "Not run: cape on scgpt (complement)" in br.markdown_report(
        bm.BenchmarkResult(records, wide, 1.0, {}), "clustering", "tiny",
        {"n_cells": 90, "n_genes": 24, "seeds": [0, 1], "quick": False, "threads": 1, "cpu_count": 2,
         "machine": "x", "load_average": 0.0})


def test_identical_models_run_once(labelled, built_models):
    records = be.run_encodings_benchmark(labelled, "clustering", label_key="cell_type", settings=TINY, seeds=[0],
                                         backbones=["scgpt"], encoding_names=["none", "cape_null"], out=None,
                                         integrations=["complement"]).records
    assert built_models == ["none"]  # cape_null is the same model: no positional encoding
    models = [r for r in records if r["kind"] == "model"]
    by = {(r["encoding"], r["metric"]): r["value"] for r in models}
    assert all(by[("none", m)] == by[("cape_null", m)] for m in ("ARI", "NMI", "ASW"))
    assert {r.get("same_run_as") for r in models if r["encoding"] == "cape_null"} == {"none"}


@pytest.mark.slow  # an end-to-end benchmark run (records, table, plot): `pytest -m slow`
def test_worker_processes_give_the_same_records(labelled):
    kw = dict(label_key="cell_type", settings=TINY, seeds=[0, 1], backbones=["scgpt"],
              encoding_names=["cape", "none", "cape_null"], out=None, integrations=["complement"])
    serial = be.run_encodings_benchmark(labelled, "clustering", **kw).records
    pooled = be.run_encodings_benchmark(labelled, "clustering", jobs=2, **kw).records

    def values(recs):
        return [(r["encoding"], r["seed"], r["metric"], r["value"], r.get("same_run_as"))
                for r in recs if r["kind"] in ("model", "baseline")]

    assert values(pooled) == values(serial)
    assert any(r.get("same_run_as") == "none" for r in pooled)  # cape_null is the `none` model, run once
    with pytest.raises(CapeInputError, match="jobs must be at least 1"):
        be.run_encodings_benchmark(labelled, "clustering", jobs=0, **kw)


@pytest.mark.parametrize("task", ["annotation", "clustering"])
def test_pretraining_epochs_per_task(labelled, monkeypatch, task):
    """Clustering has no labels, so it pretrains; annotation follows `cape train` (fine-tuning only)."""
    from cape.models import CellTransformer

    calls = []
    monkeypatch.setattr(CellTransformer, "pretrain", lambda self, data, epochs, **kw: calls.append(epochs))
    settings = bm.BenchSettings(**{**TINY.__dict__, "pretrain_epochs": 2, "annotation_pretrain_epochs": 0})
    be.run_encodings_benchmark(labelled, task, label_key="cell_type", settings=settings, seeds=[0],
                               backbones=["scgpt"], encoding_names=["none"], out=None, integrations=["replace"])
    assert calls == ([] if task == "annotation" else [2])


def test_validation_scoring_never_touches_the_test_cells(labelled, monkeypatch):
    from cape.tasks.annotation import annotation_split, validation_part

    labels = labelled.obs["cell_type"]
    outer = annotation_split(labels, seed=0)
    inner = validation_part(outer, labels)
    assert set(inner.fine_tune) | set(inner.test) == set(outer.fine_tune)
    assert not set(inner.fine_tune) & set(inner.test)
    scored = []
    real = be.annotation_run

    def spy(model, data, labels, split, settings):
        scored.append(set(split.test))
        return real(model, data, labels, split, settings)

    monkeypatch.setattr(be, "annotation_run", spy)
    settings = replace(TINY, annotation_score_on="validation")
    be.run_encodings_benchmark(labelled, "annotation", label_key="cell_type", settings=settings, seeds=[0],
                               backbones=["scgpt"], encoding_names=["none"], out=None, integrations=["replace"])
    assert scored == [set(inner.test)]
    with pytest.raises(CapeInputError, match="annotation_score_on"):
        replace(TINY, annotation_score_on="train")


# ------------------------------------------------------------------------------------------------ oracle arm
def test_oracle_rows_read_the_true_dag(perturbed):
    rows = {v.name: v for v in bm.variants(["cape_oracle", "rope_oracle"])}
    assert (rows["cape_oracle"].encoding, rows["cape_oracle"].positions) == ("cape", "true_dag")
    assert (rows["rope_oracle"].encoding, rows["rope_oracle"].positions) == ("rope", "true_dag")
    control = perturbed[perturbed.obs["condition"] == "ctrl"].copy()
    data = bm.prepare_expression(control, TINY.n_genes)
    sets, timings = bm.position_sets(data, ["true_dag"], TINY, seed=0, device="cpu")
    oracle = sets["true_dag"]
    np.testing.assert_allclose(oracle.varp["cape_dag"].toarray(), np.abs(data.varp["true_dag"].toarray()))
    assert "causal_graph" not in oracle.uns["cape"]  # Step I did not run: the graph is the truth
    assert {"cape_lorentz", "cape_angles"} <= set(oracle.varm)
    assert ("true_dag", "I_true_dag", "n_edges") in {(t["position_set"], t["step"], t["metric"]) for t in timings}


def test_oracle_rows_say_when_the_data_has_no_true_graph(labelled, tmp_path):
    result = be.run_encodings_benchmark(labelled, "clustering", dataset="tiny", label_key="cell_type",
                                        encoding_names=["cape_null", "cape_oracle"], backbones=["scgpt"],
                                        integrations=["complement"], seeds=[0], settings=TINY, out=tmp_path)
    skipped = [r for r in result.records if r["kind"] == "skipped"]
    assert [r["encoding"] for r in skipped] == ["cape_oracle"] and "no true graph" in skipped[0]["reason"]
    assert any(r["kind"] == "model" and r["encoding"] == "cape_null" for r in result.records)
    assert "no true graph" in (tmp_path / "clustering_tiny.md").read_text()


def test_paired_section_and_file_with_several_seeds(perturbed, tmp_path):
    result = be.run_encodings_benchmark(perturbed, "perturbation", dataset="sim", seeds=[0, 1, 2],
                                        encoding_names=["trainable_absolute", "cape_null", "cape_oracle"],
                                        backbones=["scgpt"], integrations=["replace"], settings=TINY, out=tmp_path)
    md = result.paths["md"].read_text()
    assert "## Paired differences over seeds" in md and "Δ vs default [95 % CI]" in md and "Δ vs cape_null" in md
    paired = json.loads(result.paths["paired"].read_text())
    row = next(r for r in paired if r["encoding"] == "cape_oracle" and r["metric"] == "mse_overall"
               and r["reference"] == "cape_null")
    assert row["n"] == 3 and row["integration"] == "replace" and row["verdict"] in (
        "better", "no detectable difference", "worse")
    values = {r["seed"]: r["value"] for r in result.records if r["kind"] == "model" and r["metric"] == "mse_overall"
              and r["encoding"] in ("cape_oracle",)}
    nulls = {r["seed"]: r["value"] for r in result.records if r["kind"] == "model" and r["metric"] == "mse_overall"
             and r["encoding"] == "cape_null"}
    assert row["difference"] == pytest.approx(np.mean([values[s] - nulls[s] for s in (0, 1, 2)]))


def test_simulated_grn_dataset_per_task(monkeypatch):
    from cape.tasks.labels import manifest_key
    from cape_benchmarks.cli import _data

    small = dict(n_genes=20, n_edges=30, n_control=60, n_cell_types=3, n_programs=2, n_single=4, n_double=2,
                 n_cells_per_perturbation=5, seed=0)
    monkeypatch.setitem(_data.GRN_SIMULATIONS, "quick", small)
    cells = _data.load_dataset("simulated_grn", "annotation", quick=True)
    assert cells.n_obs == 60 and set(cells.obs["condition"]) == {"ctrl"}
    assert manifest_key(cells, "labels") == "cell_type" and "true_dag" in cells.varp
    knockouts = _data.perturbation_data("simulated_grn", quick=True)
    assert knockouts.n_obs == 60 + 6 * 5 and "G0" not in set(knockouts.obs["condition"])


def test_default_alias_runs_each_backbones_own_default(labelled):
    result = be.run_encodings_benchmark(labelled, "clustering", dataset="tiny", label_key="cell_type",
                                        encoding_names=["default", "cape_null"], integrations=["complement"],
                                        seeds=[0], settings=TINY, out=None)
    ran = {(r["backbone"], r["encoding"]) for r in result.records if r["kind"] == "model"}
    assert ran == {("scgpt", "trainable_absolute"), ("scbert", "static_absolute"), ("scgpt", "cape_null"),
                   ("scbert", "cape_null")}
    with pytest.raises(CapeInputError, match="and default"):
        bm.variants(["defualt"])


def test_cpu_seconds_count_finished_worker_processes():
    """The report's CPU time includes the --jobs workers' (reaped children), not just the parent's."""
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    before = be._cpu_seconds()
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert be._cpu_seconds() - before >= 0.3
