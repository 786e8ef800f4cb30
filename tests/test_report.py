from __future__ import annotations

import json

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from cape import CapeInputError
from cape.report import SPLIT_KEY, evaluate_run, resolve_label_key, write_report
from cape.verdict import (
    NO_OP,
    OK,
    STAGES,
    WARNING,
    Comparison,
    Positioning,
    Training,
    accuracy,
    adjusted_rand,
    bootstrap_difference,
    comparison_finding,
    comparisons_from_records,
    headline,
    likely_causes,
    own_resources,
    positioning,
    positioning_finding,
    read_benchmark,
    resource_records,
    resources_finding,
    resources_from_records,
    resources_table,
    stage_resources,
    training_context,
    verdict,
)


@pytest.fixture
def trained() -> ad.AnnData:
    """A run's AnnData as `cape train` leaves it: two separable cell types, an embedding, predictions, a split."""
    rng = np.random.default_rng(0)
    n, m = 120, 12
    labels = np.repeat(["T", "B"], n // 2)
    x = rng.poisson(2.0, size=(n, m)).astype(np.float32)
    x[labels == "B", :4] += 6
    adata = ad.AnnData(np.log1p(x))
    adata.obs_names = [f"c{i}" for i in range(n)]
    adata.var_names = [f"g{i}" for i in range(m)]
    adata.obs["cell_type"] = pd.Categorical(labels)
    adata.obsm["X_cape"] = np.c_[(labels == "B") * 3.0, np.zeros(n)] + rng.normal(0, 0.3, (n, 2))
    pred = labels.copy()
    pred[:6] = "B"  # 6 mistakes among the T cells
    adata.obs["cape_cell_type_prediction"] = pd.Categorical(pred)
    adata.obs[SPLIT_KEY] = np.where(np.arange(n) % 10 < 3, "fine_tune", "test")
    dag = np.zeros((m, m))
    dag[0, 1], dag[1, 2], dag[0, 3] = 0.8, -0.5, 0.3
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    adata.varm["cape_poincare"] = rng.uniform(-0.5, 0.5, size=(m, 2))
    adata.var["cape_generality"] = rng.uniform(size=m)
    adata.uns["cape"] = {"causal_graph": {"removed_cycle_edges": 1, "wall_time": 1.5}}
    return adata


def _value(records, task, method, metric):
    (v,) = [r["value"] for r in records if (r["task"], r["method"], r["metric"]) == (task, method, metric)]
    return v


def test_evaluate_run_scores_test_cells_only(trained):
    records = evaluate_run(trained, "cell_type", dataset="toy")
    test = trained.obs[SPLIT_KEY] == "test"
    truth = trained.obs["cell_type"][test].astype(str)
    pred = trained.obs["cape_cell_type_prediction"][test].astype(str)
    assert _value(records, "annotation", "cape", "accuracy") == pytest.approx((truth == pred).mean())
    assert _value(records, "annotation", "logreg_pca", "accuracy") > 0.9
    assert _value(records, "clustering", "cape", "ARI") > 0.9
    assert _value(records, "graph", "cape", "edges") == 3
    assert _value(records, "graph", "cape", "edges_removed_for_acyclicity") == 1
    assert {r["method"] for r in records if r["task"] == "clustering"} == {"cape", "pca_kmeans"}


def test_report_has_figures_and_metrics(trained, tmp_path):
    records = evaluate_run(trained, "cell_type", dataset="toy")
    out = write_report(trained, records, tmp_path / "report.md", label_key="cell_type")
    text = out.read_text()
    for fig in ("dag.png", "poincare.png", "cells.png"):
        assert (tmp_path / "report_figures" / fig).stat().st_size > 1000
        assert f"report_figures/{fig}" in text
    assert "### annotation" in text and "logreg_pca" in text
    json.dumps(records)


def test_label_key_resolution(trained):
    assert resolve_label_key(trained, "auto") is None
    trained.uns["cape"]["dataset"] = {"keys": {"labels": "cell_type"}}
    assert resolve_label_key(trained, "auto") == "cell_type"
    with pytest.raises(CapeInputError, match="label key obs\\['celltype'\\] not found"):
        resolve_label_key(trained, "celltype")


def test_single_class_is_refused(trained):
    trained.obs["one"] = "T"
    with pytest.raises(CapeInputError, match="at least 2"):
        evaluate_run(trained, "one")


# ------------------------------------------------------------------------------------------------- the verdict
def test_report_opens_with_the_verdict(trained, tmp_path):
    records = evaluate_run(trained, "cell_type", dataset="toy")
    text = write_report(trained, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert text.startswith("# cape run\n\n\n## Verdict\n\n**")
    assert text.index("## Verdict") < text.index("## Run") < text.index("## Metrics")
    for page in ("verdict.html", "metrics.html"):
        html = (tmp_path / "report_figures" / page).read_text()
        assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert "<td>logreg_pca</td>" in (tmp_path / "report_figures" / "metrics.html").read_text()


def test_no_op_graph_is_called_out(trained, tmp_path):
    """0 edges: every gene at the origin; the verdict says CAPE did nothing and how to change it."""
    trained.varp["cape_dag"] = sp.csr_matrix((trained.n_vars, trained.n_vars))
    trained.var["cape_used"] = True
    trained.uns["cape"]["causal_graph"] = {"params": {"tau": 0.2}, "n_cells": 120}
    pos = positioning(trained)
    assert (pos.n_used, pos.n_positioned, pos.n_edges) == (12, 0, 0)
    finding = positioning_finding(pos)
    assert finding.level == NO_OP
    assert "no edges" in finding.text and "CAPE changed nothing" in finding.text
    (remedy,) = finding.remedies
    assert "`causal.tau`" in remedy and "τ = 0.2" in remedy and "auto" in remedy and "120 cells" in remedy
    text = write_report(trained, evaluate_run(trained, "cell_type"), tmp_path / "r.md", label_key="cell_type")
    verdict_section = text.read_text().split("## Run")[0]
    assert "**CAPE did nothing in this run" in verdict_section
    assert "- **CAPE did nothing** — The causal graph has no edges among the 12 genes used" in verdict_section
    assert not (tmp_path / "r_figures" / "dag.png").exists()  # nothing to draw, and the report says so
    assert "## Causal gene graph (Step I)\n\nThe causal graph has no edges: nothing to draw." in text.read_text()
    assert (tmp_path / "r_figures" / "poincare.png").exists()  # no var['cape_embedded']: positions as they are
    trained.var["cape_embedded"] = False
    text = write_report(trained, [], tmp_path / "s.md").read_text()
    assert not (tmp_path / "s_figures" / "poincare.png").exists()
    assert "No gene got a position: every gene sits at the centre of the disk." in text
    causes = likely_causes(training_context(trained), positioning(trained))
    assert causes[-1][0] == "no gene got a position: the encoding added nothing"


def test_embedded_genes_count_only_when_used():
    adata = ad.AnnData(np.zeros((3, 6), dtype=np.float32))
    adata.var["cape_used"] = [True, True, True, True, False, False]
    adata.var["cape_embedded"] = [True, False, False, False, True, True]  # two positioned genes are not used
    dag = np.zeros((6, 6))
    dag[0, 4] = dag[4, 5] = 0.5
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    pos = positioning(adata)
    assert (pos.n_used, pos.n_positioned, pos.n_edges) == (4, 1, 2)
    finding = positioning_finding(pos)
    assert finding.level == WARNING and finding.text.startswith("Only 25% of the genes used (1 of 4)")
    del adata.var["cape_embedded"]  # no Step II: the edges of the DAG decide
    assert positioning(adata).n_positioned == 1
    adata.var["cape_used"] = True
    assert positioning(adata).fraction == pytest.approx(0.5)
    assert positioning_finding(positioning(adata)).level == OK
    assert positioning(ad.AnnData(np.zeros((3, 2), dtype=np.float32))) is None


def test_evaluate_keeps_a_sparse_matrix_sparse_for_the_pca_baseline(trained, monkeypatch):
    """A 10x-shaped X must reach the PCA baseline sparse (densifying 5,000 × 33,000 cost 2.5 GB in evaluate)."""
    from cape.tasks import clustering

    trained.X = sp.csr_matrix(trained.X)
    seen = []
    original = clustering.BASELINES["pca_kmeans"]

    def spy(x, batches, seed, n_comps):
        seen.append(sp.issparse(x))
        return original[0](x, batches, seed, n_comps)

    monkeypatch.setitem(clustering.BASELINES, "pca_kmeans", (spy, *original[1:]))
    records = evaluate_run(trained, "cell_type", dataset="toy", seed=0)
    assert seen == [True]
    assert any(r["method"] == "pca_kmeans" and r["metric"] == "ARI" for r in records)


def test_calibrated_threshold_and_scan_reach_the_verdict():
    """With tau='auto' the verdict reads the τ Step I applied and lists the edges left at smaller thresholds."""
    adata = ad.AnnData(np.zeros((3, 4), dtype=np.float32))
    dag = np.zeros((4, 4))
    dag[0, 1] = 0.05
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    adata.uns["cape"] = {"causal_graph": {
        "params": {"tau": "auto"}, "tau_used": 0.04, "tau_rule": "auto: positioning", "n_cells": 30,
        "threshold_scan": {"tau": np.array([0.2, 0.1, 0.04, 0.02]), "n_edges": np.array([0, 0, 1, 3]),
                           "n_positioned": np.array([0, 0, 2, 4])}}}
    pos = positioning(adata)
    assert pos.tau == pytest.approx(0.04) and pos.tau_rule == "auto: positioning"
    finding = positioning_finding(pos)
    assert finding.level == OK and "τ = 0.04 (auto: positioning)" in finding.text
    dag[0, 1] = 0
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    (remedy,) = positioning_finding(positioning(adata)).remedies
    assert "τ 0.02: 3 edges, 4 genes" in remedy and "τ 0.2:" not in remedy
    assert "set `causal.tau: auto`" not in remedy  # already calibrated
    adata.uns["cape"]["causal_graph"]["tau_rule"] = "fixed"
    (remedy,) = positioning_finding(positioning(adata)).remedies
    assert "set `causal.tau: auto`" in remedy


def test_baseline_wins_names_cause_and_remedy(trained, tmp_path):
    """A transformer that predicts one class loses to logistic regression beyond the bootstrap spread."""
    trained.obs["cape_cell_type_prediction"] = pd.Categorical(["T"] * trained.n_obs)
    records = evaluate_run(trained, "cell_type", dataset="toy", seed=3)
    (cmp,) = [c for c in comparisons_from_records(records) if c.task == "annotation"]
    assert cmp.value == pytest.approx(0.5, abs=0.02) and cmp.baseline_value > 0.9
    assert cmp.low <= cmp.diff <= cmp.high < 0
    assert cmp.n_cells == (trained.obs[SPLIT_KEY] == "test").sum()
    findings = verdict(trained, records)
    (warning,) = [f for f in findings if f.topic == "annotation"]
    assert warning.level == WARNING and "the simple baseline is better, by more than the variation" in warning.text
    n_ft = int((trained.obs[SPLIT_KEY] == "fine_tune").sum())
    assert f"too few cells to train a transformer from scratch: it learnt from {n_ft} labelled cells" in warning.text
    assert any("`train.checkpoint" in r and "`train.pretrain_epochs`" in r for r in warning.remedies)
    text = write_report(trained, records, tmp_path / "r.md", label_key="cell_type").read_text()
    assert "logistic regression on PCA beats the transformer on cell-type annotation" in text.split("## Run")[0]
    # seeded: the same records again
    assert evaluate_run(trained, "cell_type", dataset="toy", seed=3) == records


def test_fine_run_has_no_warning(trained):
    trained.obs["cape_cell_type_prediction"] = trained.obs["cell_type"]  # as good as it gets
    trained.var["cape_embedded"] = [True] * 9 + [False] * 3
    findings = verdict(trained, evaluate_run(trained, "cell_type"), stage_resources(None))
    assert [f.level for f in findings] == [OK] * len(findings)
    assert {f.topic for f in findings} == {"positions", "annotation", "clustering", "resources"}
    assert headline(findings).startswith("No problems found")
    (ann,) = [f for f in findings if f.topic == "annotation"]
    assert "no clear difference" in ann.text or "is better than logistic regression" in ann.text


def test_comparison_finding_levels():
    base = dict(task="annotation", metric="accuracy", method="cape", baseline="logreg_pca", value=0.6,
                baseline_value=0.8, n_cells=100)
    lose = Comparison(**base, diff=-0.2, low=-0.3, high=-0.1)
    tie = Comparison(**base, diff=-0.2, low=-0.3, high=0.01)
    win = Comparison(**(base | {"value": 0.9}), diff=0.1, low=0.05, high=0.15)
    causes = [("cause A", "remedy A")]
    assert comparison_finding(lose, causes).level == WARNING
    assert comparison_finding(lose, causes).remedies == ("remedy A",)
    assert "Likely cause: cause A." in comparison_finding(lose, causes).text
    assert comparison_finding(tie, causes).level == OK and "no clear difference" in comparison_finding(tie).text
    assert "is better than logistic regression on PCA, by more than" in comparison_finding(win).text


def test_likely_causes():
    few = Training(n_fine_tune=90, pretrain_epochs=0, pretrained_weights=False)
    many = Training(n_fine_tune=5000, pretrain_epochs=3, pretrained_weights=False)
    ckpt = Training(n_fine_tune=90, pretrain_epochs=0, pretrained_weights=True)
    sparse = Positioning(n_used=100, n_positioned=10, n_edges=7, tau=0.2)
    dense = Positioning(n_used=100, n_positioned=90, n_edges=300)
    (c,) = likely_causes(few, dense)
    assert c[0].startswith("too few cells") and "90 labelled cells with no pretraining" in c[0] and "now 0" in c[1]
    (c,) = likely_causes(many, dense)
    assert c[0].startswith("a transformer trained from scratch") and "3 epochs of masked pretraining" in c[0]
    causes = likely_causes(ckpt, sparse)
    assert [c[0] for c in causes] == ["few genes positioned (10%): the encoding adds little"]
    assert "`causal.tau`" in causes[0][1]
    (c,) = likely_causes(ckpt, dense)
    assert "`train.epochs`" in c[1]


def test_training_context(trained):
    ctx = training_context(trained)
    assert ctx == Training(int((trained.obs[SPLIT_KEY] == "fine_tune").sum()), 0, False)
    assert ctx.name == "the transformer"
    trained.uns["cape"]["model"] = {"history": {"pretrain": {"train_loss": [1.0, 0.9]}}, "checkpoint": "ckpt/",
                                    "architecture": "scgpt", "backbone": {"encoding": "cape", "d_model": 64}}
    ctx = training_context(trained)
    assert ctx == Training(ctx.n_fine_tune, 2, True, "scgpt", "cape")
    assert ctx.name == "the transformer (scGPT + CAPE)"


def test_an_encoding_without_positions_is_named():
    """With encoding 'none' the empty graph changes CAPE's positions, not the transformer: say which."""
    empty = Positioning(n_used=30, n_positioned=0, n_edges=0)
    assert "without positional information" in positioning_finding(empty, "cape").text
    text = positioning_finding(empty, "trainable_absolute").text
    assert "without positional information" not in text
    assert "used the 'trainable_absolute' encoding, which does not use the causal graph" in text
    plain = Training(90, 0, False, "scbert", "none")
    assert [c for c, _ in likely_causes(plain, empty)] == [
        "too few cells to train a transformer from scratch: it learnt from 90 labelled cells with no pretraining, "
        "while a linear model on PCA needs a few cells per class"]
    assert plain.name == "the transformer (scBERT + none)"


# ------------------------------------------------------------------------------------------------- bootstrap
def test_bootstrap_difference_of_accuracy():
    y = np.array(["a"] * 50 + ["b"] * 50)
    a = y.copy()
    b = y.copy()
    b[:20] = "b"  # 20 mistakes
    diff, low, high = bootstrap_difference(y, a, b, accuracy, seed=0)
    assert diff == pytest.approx(0.2)
    assert 0 < low < diff < high < 0.4
    assert bootstrap_difference(y, a, b, accuracy, seed=0) == (diff, low, high)
    assert bootstrap_difference(y, a, a, accuracy) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="equally long"):
        bootstrap_difference(y, a[:3], b, accuracy)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from("abc")), min_size=1, max_size=40))
def test_adjusted_rand_matches_sklearn(pairs):
    from sklearn.metrics import adjusted_rand_score

    clusters, labels = map(np.array, zip(*pairs, strict=True))
    assert adjusted_rand(labels, clusters) == pytest.approx(adjusted_rand_score(labels, clusters), abs=1e-12)


# ------------------------------------------------------------------------------------------------- resources
def _bench(path, rows):
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    path.write_text(header + "".join("\t".join(map(str, r)) + "\n" for r in rows))


def test_benchmark_files_are_read_and_missing_ones_say_so(tmp_path):
    _bench(tmp_path / "preprocess.tsv", [(12.32, "0:00:12", 544.79, 1166.8, 521.4, 531.7, 580.1, 2.8, 84.4, 10.9)])
    _bench(tmp_path / "causal.tsv", [(10.0, "0:00:10", 600.0, 1, 1, 1, 1, 1, 1, 1),
                                     (20.0, "0:00:20", 900.0, 1, 1, 1, 1, 1, 1, 1)])  # --benchmark-repeats 2
    _bench(tmp_path / "embed.tsv", [(0.4, "0:00:00", "NA", "NA", "NA", "NA", "NA", "NA", "NA", "NA")])
    (tmp_path / "encode.tsv").write_text("")  # empty: not measured, no crash
    assert read_benchmark(tmp_path / "preprocess.tsv") == {"seconds": 12.32, "max_rss_mb": 544.79}
    assert read_benchmark(tmp_path / "causal.tsv") == {"seconds": 15.0, "max_rss_mb": 900.0}
    assert read_benchmark(tmp_path / "embed.tsv") == {"seconds": 0.4, "max_rss_mb": None}
    assert read_benchmark(tmp_path / "train.tsv") is None
    rows = stage_resources(tmp_path)
    assert [r["stage"] for r in rows] == list(STAGES)
    assert [r["source"] for r in rows] == ["Snakemake benchmark"] * 3 + ["not measured"] * 2
    _, table = resources_table(rows)
    assert table[1] == ["causal", "15.0 s", "900.0 MB", "Snakemake benchmark"]
    assert table[2][2] == "not measured" and table[4][1:3] == ["not measured", "not measured"]
    records = resource_records(rows, dataset="d", seed=0)
    assert {(r["method"], r["metric"]) for r in records} == {("preprocess", "seconds"), ("preprocess", "max_rss_mb"),
                                                            ("causal", "seconds"), ("causal", "max_rss_mb"),
                                                            ("embed", "seconds")}
    back = resources_from_records(records)
    assert back[2] == {"stage": "embed", "seconds": 0.4, "max_rss_mb": None, "source": "Snakemake benchmark"}
    finding = resources_finding(rows)
    assert "the longest stage causal (15 s)" in finding.text and "largest peak memory causal (900 MB)" in finding.text
    assert finding.text.endswith("Not measured: encode, train.")
    assert all(r["source"] == "not measured" for r in stage_resources(tmp_path / "nowhere"))


def test_own_resources_are_this_process():
    row = own_resources()
    assert row["stage"] == "evaluate" and "getrusage" in row["source"]
    assert 10 < row["max_rss_mb"] < 1e6


def test_cli_evaluate_reports_resources(trained, tmp_path, capsys):
    from cape.cli import main

    trained.write_h5ad(tmp_path / "trained.h5ad")
    bench = tmp_path / "bench"
    bench.mkdir()
    _bench(bench / "train.tsv", [(91.8, "0:01:31", 738.66, 1, 1, 1, 1, 1, 1, 1)])
    args = ["evaluate", "--input", str(tmp_path / "trained.h5ad"), "--label-key", "cell_type", "--name", "toy",
            "--metrics", str(tmp_path / "m.json"), "--report", str(tmp_path / "r.md")]
    assert main([*args, "--benchmarks", str(bench)]) == 0
    text = (tmp_path / "r.md").read_text()
    assert "| train | 91.8 s | 738.7 MB | Snakemake benchmark |" in text
    assert "| causal | not measured | not measured | not measured |" in text
    assert "| evaluate |" in text and "this process (resource.getrusage)" in text
    records = json.loads((tmp_path / "m.json").read_text())
    res = {(r["method"], r["metric"]): r["value"] for r in records if r["task"] == "resources"}
    assert res[("train", "max_rss_mb")] == pytest.approx(738.66) and res[("evaluate", "max_rss_mb")] > 10
    assert ("causal", "seconds") not in res
    assert main([*args, "--benchmarks", str(tmp_path / "missing")]) == 2
    assert "--benchmarks" in capsys.readouterr().err


def test_without_labels_the_verdict_says_so(trained, tmp_path):
    records = evaluate_run(trained, None)
    findings = verdict(trained, records)
    assert [f.topic for f in findings] == ["positions", "baselines"]
    assert "No cell labels" in findings[1].text and "`labels: <obs column>`" in findings[1].text
    text = write_report(trained, records, tmp_path / "r.md").read_text()
    assert "### comparison" not in text and "No cell labels" in text.split("## Run")[0]
