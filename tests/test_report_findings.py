from __future__ import annotations

import dataclasses

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from cape.report import evaluate_run, write_report
from cape.report.findings import (
    NO_OP,
    OK,
    WARNING,
    Positioning,
    Training,
    cells_finding,
    comparison_finding,
    headline,
    hierarchy_finding,
    likely_causes,
    positioning,
    positioning_finding,
    positions_remedies,
    rare_genes_remedy,
    tau_remedy,
    training_context,
    verdict,
)
from cape.report.resources import (
    stage_resources,
)
from cape.report.statistics import (
    Comparison,
    comparisons_from_records,
)
from cape.tasks.labels import SPLIT_KEY


# ------------------------------------------------------------------------------------------------- the verdict
def test_report_opens_with_the_verdict(trained_adata, tmp_path):
    records = evaluate_run(trained_adata, "cell_type", dataset="toy")
    text = write_report(trained_adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert text.startswith("# cape run\n\n\n## Verdict\n\n**")
    assert text.index("## Verdict") < text.index("## Run") < text.index("## Metrics")
    for page in ("verdict.html", "metrics.html"):
        html = (tmp_path / "report_figures" / page).read_text()
        assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert "<td>logreg_pca</td>" in (tmp_path / "report_figures" / "metrics.html").read_text()


def test_no_op_graph_is_called_out(trained_adata, tmp_path):
    """0 edges: every gene at the origin; the verdict says CAPE did nothing and how to change it."""
    trained_adata.varp["cape_dag"] = sp.csr_matrix((trained_adata.n_vars, trained_adata.n_vars))
    trained_adata.var["cape_used"] = True
    trained_adata.uns["cape"]["causal_graph"] = {"params": {"tau": 0.2}, "n_cells": 120}
    pos = positioning(trained_adata)
    assert (pos.n_used, pos.n_positioned, pos.n_edges) == (12, 0, 0)
    finding = positioning_finding(pos)
    assert finding.level == NO_OP
    assert "no edges" in finding.text and "CAPE changed nothing" in finding.text
    assert finding.remedies == ()  # no threshold scan recorded: no remedy that could be checked
    trained_adata.uns["cape"]["causal_graph"]["threshold_scan"] = {
        "tau": np.array([0.2, 0.1, 0.05]), "n_edges": np.array([0, 0, 5]), "n_positioned": np.array([0, 0, 7])}
    (remedy,) = positioning_finding(positioning(trained_adata)).remedies
    assert "`causal.tau: 0.05`" in remedy and "5 edges" in remedy and "7 of the 12 genes" in remedy
    assert "τ = 0.2" in remedy
    # the budget's record is read only where the budget sized the graph
    assert positioning(trained_adata).budget_pairs is None
    trained_adata.uns["cape"]["causal_graph"] |= {"tau_rule": "budget", "edge_budget": {"n_pairs": 0}}
    assert positioning(trained_adata).budget_pairs == 0
    (remedy,) = positioning_finding(positioning(trained_adata)).remedies
    assert "only 0 gene pairs were significant" in remedy and "the other 5 edges" in remedy
    del trained_adata.uns["cape"]["causal_graph"]["tau_rule"], trained_adata.uns["cape"]["causal_graph"]["edge_budget"]
    records = evaluate_run(trained_adata, "cell_type")
    text = write_report(trained_adata, records, tmp_path / "r.md", label_key="cell_type")
    verdict_section = text.read_text().split("## Run")[0]
    assert "**CAPE did nothing in this run" in verdict_section
    assert "- **CAPE did nothing** — The causal graph has no edges among the 12 genes used" in verdict_section
    assert not (tmp_path / "r_figures" / "dag.png").exists()  # nothing to draw, and the report says so
    assert "## Causal gene graph (Step I)\n\nThe causal graph has no edges: nothing to draw." in text.read_text()
    assert (tmp_path / "r_figures" / "poincare.png").exists()  # no var['cape_embedded']: positions as they are
    trained_adata.var["cape_embedded"] = False
    text = write_report(trained_adata, [], tmp_path / "s.md").read_text()
    assert not (tmp_path / "s_figures" / "poincare.png").exists()
    assert "No gene got a position: every gene sits at the centre of the disk." in text
    causes = likely_causes(training_context(trained_adata), positioning(trained_adata))
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
    assert finding.level == OK and finding.text.startswith("25% of the genes used (1 of 4)")
    assert "still reads every gene's expression" in finding.text
    del adata.var["cape_embedded"]  # no Step II: the edges of the DAG decide
    assert positioning(adata).n_positioned == 1
    adata.var["cape_used"] = True
    assert positioning(adata).fraction == pytest.approx(0.5)
    assert positioning_finding(positioning(adata)).level == OK
    assert positioning(ad.AnnData(np.zeros((3, 2), dtype=np.float32))) is None


def test_genes_spread_by_step2_are_not_said_to_sit_at_the_centre():
    """Step II's default (isolated='negatives') spreads genes without an edge apart: no claim about the centre."""
    adata = ad.AnnData(np.zeros((3, 6), dtype=np.float32))
    dag = np.zeros((6, 6))
    dag[0, 1] = 0.5
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    adata.uns["cape"] = {"hyperbolic_embedding": {"params": {"isolated": "negatives"}}}
    finding = positioning_finding(positioning(adata))
    assert finding.level == OK and "centre" not in finding.text
    assert "Step II spread the others apart, so their positions carry no causal information" in finding.text
    adata.varp["cape_dag"] = sp.csr_matrix((6, 6))
    finding = positioning_finding(positioning(adata))
    assert finding.level == NO_OP and "centre" not in finding.text and "changed nothing" not in finding.text
    assert "no gene's position carries causal information" in finding.text
    causes = likely_causes(Training(n_fine_tune=10, pretrain_epochs=0, pretrained_weights=True), positioning(adata))
    assert causes == [("no gene got a causal position: the encoding added nothing causal", causes[0][1])]
    adata.uns["cape"]["hyperbolic_embedding"]["params"]["isolated"] = "origin"
    assert "sits at the centre" in positioning_finding(positioning(adata)).text


def test_fewer_cells_than_genes_in_step1_reaches_the_verdict():
    adata = ad.AnnData(np.zeros((3, 6), dtype=np.float32))
    adata.uns["cape"] = {"causal_graph": {"n_cells": 30, "n_genes": 100}}
    finding = cells_finding(adata)
    assert finding.level == WARNING and "from 30 cells for 100 genes" in finding.text
    assert finding.short in headline(verdict(adata, []))
    adata.uns["cape"]["causal_graph"]["n_cells"] = 100
    assert cells_finding(adata) is None and cells_finding(ad.AnnData(np.zeros((3, 2)))) is None


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
    assert "`causal.tau: 0.02`" in remedy and "3 edges there, positioning 4 of the 4 genes" in remedy


@pytest.mark.parametrize("ranking", ["consensus", "shrunk_partial_correlation"])
def test_a_pair_ranking_names_its_lightest_weight_not_a_cut(ranking):
    pos = Positioning(n_used=4, n_positioned=2, n_edges=1, tau=0.064, tau_rule="budget", pair_ranking=ranking)
    text = positioning_finding(pos).text
    assert "1 edge with weights down to 0.064 (budget)" in text and "τ =" not in text
    pos = Positioning(n_used=4, n_positioned=2, n_edges=1, tau=0.064, tau_rule="budget", pair_ranking="fit")
    assert "τ = 0.064" in positioning_finding(pos).text


def test_a_lower_threshold_is_advised_only_where_the_scan_shows_it_works():
    """pbmc68k_reduced's default run: 48 % positioned, and τ 0.01 adds one edge. No τ advice, no warning."""
    pos = Positioning(n_used=300, n_positioned=144, n_edges=132, tau=0.05, tau_rule="budget", n_cells=700,
                      scan=((0.2, 10, 18), (0.1, 60, 90), (0.05, 132, 144), (0.02, 132, 144), (0.01, 133, 146),
                            (0.005, 400, 290)))  # below the noise floor: never advised
    assert tau_remedy(pos) is None
    (cells,) = positions_remedies(pos)
    assert cells.startswith("more cells (this run: 700)") and "noise floor τ 0.01" in cells
    finding = positioning_finding(pos)
    assert finding.level == OK and finding.remedies == () and "48% of the genes used (144 of 300)" in finding.text
    assert headline([finding]).startswith("No problems found: 48% of the genes got a position")
    causes = likely_causes(Training(90, 0, True), pos)
    assert causes == [("few genes positioned (48%): the encoding adds little", cells)]
    enough = Positioning(n_used=300, n_positioned=144, n_edges=132, tau=0.05,
                         scan=((0.05, 132, 144), (0.02, 200, 160), (0.01, 260, 170)))
    (remedy,) = positioning_finding(enough).remedies
    assert "`causal.tau: 0.02`" in remedy and "160 of the 300 genes" in remedy and "significant" not in remedy
    # sized by the budget: the advice says how far the lower τ goes beyond the pairs the budget found significant
    budgeted = dataclasses.replace(enough, tau_rule="budget", budget_pairs=132)
    (remedy,) = positioning_finding(budgeted).remedies
    assert "only 132 gene pairs were significant" in remedy and "the other 68 edges rest on the fit's weights" in remedy


def _graph_with_budget_record(tau_rule: str, budget: dict) -> ad.AnnData:
    adata = ad.AnnData(np.zeros((5, 4), dtype=np.float32))
    dag = np.zeros((4, 4))
    dag[0, 1] = dag[1, 2] = dag[2, 3] = 0.3
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    adata.uns["cape"] = {"causal_graph": {"tau_used": 0.2, "tau_rule": tau_rule, "n_cells": 1500,
                                          "edge_budget": budget}}
    return adata


def test_a_graph_the_budgets_test_did_not_support_is_a_warning():
    """The budget tested every pair, found none significant, and Step I fell back on τ 'auto': the verdict says the
    edges are guesses (a simulated 10x file whose regulated genes were not among the highly variable ones)."""
    tested = {"n_pairs": 0, "fdr": 0.05, "n_cells_tested": 1500, "n_pairs_tested": 44850, "n_pairs_significant": 0,
              "n_pairs_permuted": 0, "fallback": "no gene pair has a significant partial correlation (…)"}
    finding = positioning_finding(positioning(_graph_with_budget_record("auto: paper", tested)))
    assert finding.level == WARNING and finding.short == "Step I's graph rests on weak evidence"
    assert ("100% of the genes used (4 of 4) got a position from the causal graph (3 edges at τ = 0.2 (auto: paper)), "
            "but Step I's edge budget found no gene pair with a significant partial correlation (FDR 0.05, 1,500 "
            "cells, 44,850 pairs tested)") in finding.text and "guesses" in finding.text
    assert finding.remedies == ("more cells (this run: 1,500): the test's power grows with them",)
    assert headline([finding]).startswith("Read with care: Step I's graph rests on weak evidence")
    # significant pairs, but no more than on the permuted copy: the same warning, saying so
    decoy = tested | {"n_pairs_significant": 12, "n_pairs_permuted": 15}
    text = positioning_finding(positioning(_graph_with_budget_record("auto: paper", decoy))).text
    assert "12 gene pair(s) with a significant partial correlation, no more than the 15 it found on a copy" in text
    # the budget sized the graph, or could not test (too few cells: no count recorded): no such warning
    for rule, record in (("budget", tested | {"n_pairs": 3}), ("auto: paper", {"fallback": "fewer than genes + 10 "
                                                                                 "cells (…): tau='auto' rule"})):
        pos = positioning(_graph_with_budget_record(rule, record))
        assert pos.weak_evidence is None and positioning_finding(pos).level == OK


def test_a_graph_whose_edges_join_rarely_detected_genes_is_a_warning_with_a_remedy():
    """Most edges untested by the confidence (a gene varying in fewer than 10 cells: a TPM file of 250 cells whose
    highly variable genes are seen in a handful of cells each): the verdict says so and names preprocess.min_cells;
    below half of the edges, no such warning."""
    adata = _graph_with_budget_record("auto: paper", {"fallback": "fewer than genes + 10 cells (…)"})
    adata.uns["cape"]["causal_graph"]["edge_confidence"] = {"n_untested": 2, "min_detected_cells": 10, "n_solid": 0}
    finding = positioning_finding(positioning(adata))
    assert finding.level == WARNING and finding.short == "most of Step I's edges join genes seen in a handful of cells"
    assert "but 2 of the edges join a gene that varies in fewer than 10 cells" in finding.text
    assert finding.remedies == ("`preprocess.min_cells: 20`: the genes used are then chosen among those detected in "
                                "at least 20 cells, whose edges and pairs Step I can test (2 of this run's 3 edges "
                                "could not be)",)
    # the budget tested the pairs it could and found none: the weak-evidence warning names both remedies
    tested = {"n_pairs": 0, "fdr": 0.05, "n_cells_tested": 1500, "n_pairs_tested": 3, "n_pairs_significant": 0}
    weak = _graph_with_budget_record("auto: paper", tested)
    weak.uns["cape"]["causal_graph"]["edge_confidence"] = {"n_untested": 3, "min_detected_cells": 10}
    finding = positioning_finding(positioning(weak))
    assert finding.short == "Step I's graph rests on weak evidence" and len(finding.remedies) == 2
    assert finding.remedies[1].startswith("`preprocess.min_cells: 20`")
    adata.uns["cape"]["causal_graph"]["edge_confidence"] |= {"n_untested": 1, "n_solid": 2}  # 1 of 3 edges
    assert positioning_finding(positioning(adata)).level == OK
    assert rare_genes_remedy(positioning(adata)) == ()


def test_a_graph_with_few_solid_edges_is_a_warning():
    """Edges tested, but fewer than a tenth solid (a 250-cell TPM file with preprocess.min_cells: 20: 98 edges, none
    solid): the verdict says the positions rest on guesses; from a tenth on, or without a confidence, no warning."""
    adata = _graph_with_budget_record("auto: paper", {"fallback": "fewer than genes + 10 cells (…)"})
    adata.uns["cape"]["causal_graph"]["edge_confidence"] = {"n_untested": 0, "min_detected_cells": 10, "n_solid": 0}
    finding = positioning_finding(positioning(adata))
    assert finding.level == WARNING and finding.short == "few of Step I's edges are solid"
    assert "(3 edges at τ = 0.2 (auto: paper)), but none of them is solid (confidence ≥ 0.95" in finding.text
    assert finding.remedies == ("more cells (this run: 1,500): the edge test's power grows with them",)
    assert headline([finding]).startswith("Read with care: few of Step I's edges are solid")
    adata.uns["cape"]["causal_graph"]["edge_confidence"]["n_solid"] = 1  # 1 of 3: a third
    assert positioning_finding(positioning(adata)).level == OK
    del adata.uns["cape"]["causal_graph"]["edge_confidence"]
    assert positioning(adata).n_solid is None and positioning_finding(positioning(adata)).level == OK


def test_baseline_wins_names_cause_and_remedy(trained_adata, tmp_path):
    """A transformer that predicts one class loses to logistic regression beyond the bootstrap spread."""
    trained_adata.obs["cape_cell_type_prediction"] = pd.Categorical(["T"] * trained_adata.n_obs)
    records = evaluate_run(trained_adata, "cell_type", dataset="toy", seed=3)
    (cmp,) = [c for c in comparisons_from_records(records) if c.task == "annotation"]
    assert cmp.value == pytest.approx(0.5, abs=0.02) and cmp.baseline_value > 0.9
    assert cmp.low <= cmp.diff <= cmp.high < 0
    assert cmp.n_cells == (trained_adata.obs[SPLIT_KEY] == "test").sum()
    findings = verdict(trained_adata, records)
    (warning,) = [f for f in findings if f.topic == "annotation"]
    assert warning.level == WARNING and "the simple baseline is better, by more than the variation" in warning.text
    n_ft = int((trained_adata.obs[SPLIT_KEY] == "fine_tune").sum())
    assert f"too few cells to train a transformer from scratch: it learnt from {n_ft} labelled cells" in warning.text
    assert any("`train.checkpoint" in r and "`train.pretrain_epochs`" in r for r in warning.remedies)
    text = write_report(trained_adata, records, tmp_path / "r.md", label_key="cell_type").read_text()
    assert "logistic regression on PCA beats the transformer on cell-type annotation" in text.split("## Run")[0]
    # seeded: the same records again
    assert evaluate_run(trained_adata, "cell_type", dataset="toy", seed=3) == records


def test_fine_run_has_no_warning(trained_adata):
    trained_adata.obs["cape_cell_type_prediction"] = trained_adata.obs["cell_type"]  # as good as it gets
    trained_adata.var["cape_embedded"] = [True] * 9 + [False] * 3
    at_ceiling = verdict(trained_adata, evaluate_run(trained_adata, "cell_type"), stage_resources(None))
    assert all("both score at the ceiling" in f.text for f in at_ceiling if f.level != OK)  # the baselines too
    # every fifth cell's profile from another cell: the baselines, which read X, are no longer perfect
    trained_adata.X = trained_adata.X[np.where(np.arange(trained_adata.n_obs) % 5 == 0,
                                               trained_adata.n_obs - 1 - np.arange(trained_adata.n_obs),
                                               np.arange(trained_adata.n_obs))]
    findings = verdict(trained_adata, evaluate_run(trained_adata, "cell_type"), stage_resources(None))
    assert [f.level for f in findings] == [OK] * len(findings), [f.text for f in findings]
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
    # 9 scored cells: an undecided interval is not "no clear difference" but too few cells to tell
    few = Comparison(**(base | {"n_cells": 9}), diff=-0.34, low=-0.78, high=0.11)
    finding = comparison_finding(few, causes)
    assert finding.level == WARNING and "too few cells to tell" in finding.text
    assert "over the 9 test cells" in finding.text
    assert finding.short in headline([finding])
    assert comparison_finding(Comparison(**(base | {"n_cells": 9}), diff=-0.5, low=-0.7, high=-0.3)).level == WARNING


def test_both_at_the_ceiling_says_the_data_cannot_separate_them():
    top = dict(task="annotation", metric="accuracy", method="cape", baseline="logreg_pca", value=1.0,
               baseline_value=1.0, n_cells=490)
    finding = comparison_finding(Comparison(**top, diff=0.0, low=0.0, high=0.0))
    assert finding.level == WARNING and "both score at the ceiling" in finding.text
    assert "too easy to separate them" in finding.text and "+0.00 to +0.00" in finding.text
    assert finding.short in headline([finding])
    near = Comparison(**(top | {"baseline_value": 0.9}), diff=0.1, low=0.07, high=0.13)
    assert "ceiling" not in comparison_finding(near).text


def test_likely_causes():
    few = Training(n_fine_tune=90, pretrain_epochs=0, pretrained_weights=False)
    many = Training(n_fine_tune=5000, pretrain_epochs=3, pretrained_weights=False)
    ckpt = Training(n_fine_tune=90, pretrain_epochs=0, pretrained_weights=True)
    sparse = Positioning(n_used=100, n_positioned=10, n_edges=7, tau=0.2, scan=((0.1, 40, 60),))
    dense = Positioning(n_used=100, n_positioned=90, n_edges=300)
    (c,) = likely_causes(few, dense)
    assert c[0].startswith("too few cells") and "90 labelled cells with no pretraining" in c[0] and "now 0" in c[1]
    (c,) = likely_causes(many, dense)
    assert c[0].startswith("a transformer trained from scratch") and "3 epochs of self-supervised pretraining" in c[0]
    assert "pretrain longer (`train.pretrain_epochs`, now 3)" in c[1]
    causes = likely_causes(ckpt, sparse)
    assert [c[0] for c in causes] == ["few genes positioned (10%): the encoding adds little"]
    assert "`causal.tau: 0.1`" in causes[0][1]
    (c,) = likely_causes(ckpt, dense)
    assert "`train.epochs`" in c[1]
    # the clustered embedding was made before fine-tuning: no labelled cell is blamed
    (c,) = likely_causes(many, dense, labels_seen=False)
    assert c[0].startswith("a transformer trained from scratch without labels") and "labelled" not in c[0]
    assert "3 epochs of self-supervised pretraining" in c[0] and "now 3" in c[1]


def test_training_context(trained_adata):
    ctx = training_context(trained_adata)
    assert ctx == Training(int((trained_adata.obs[SPLIT_KEY] == "fine_tune").sum()), 0, False)
    assert ctx.name == "the transformer"
    trained_adata.uns["cape"]["model"] = {"history": {"pretrain": {"train_loss": [1.0, 0.9]}}, "checkpoint": "ckpt/",
                                    "architecture": "scgpt", "backbone": {"encoding": "cape", "d_model": 64}}
    ctx = training_context(trained_adata)
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


def test_without_labels_the_headline_claims_no_comparison(trained_adata):
    trained_adata.var["cape_embedded"] = [True] * 9 + [False] * 3  # positions fine: the headline says no problems
    findings = verdict(trained_adata, evaluate_run(trained_adata, None), stage_resources(None))
    assert [f.level for f in findings] == [OK] * len(findings)
    text = headline(findings)
    assert text.startswith("No problems found") and "not compared with baselines" in text
    assert "no baseline beats" not in text


def test_without_labels_the_verdict_says_so(trained_adata, tmp_path):
    records = evaluate_run(trained_adata, None)
    findings = verdict(trained_adata, records)
    assert [f.topic for f in findings] == ["positions", "baselines"]
    assert "No cell labels" in findings[1].text and "`labels: <obs column>`" in findings[1].text
    text = write_report(trained_adata, records, tmp_path / "r.md").read_text()
    assert "### comparison" not in text and "No cell labels" in text.split("## Run")[0]


def test_missing_hierarchy_reaches_the_verdict_with_its_meaning():
    adata = ad.AnnData(np.zeros((3, 4), dtype=np.float32))
    adata.uns["cape"] = {"hyperbolic_embedding": {"hierarchy_spearman": 0.14, "hierarchy_n_genes": 61}}
    finding = hierarchy_finding(adata)
    assert finding.level == WARNING
    assert "Spearman(generality, −norm) = 0.14 over the 61 genes with an edge" in finding.text
    assert "an identity, not a causal hierarchy" in finding.text
    assert finding.short in headline(verdict(adata, []))
    assert "embed.positive_weights: per_anchor" in finding.text  # Eq. 16's weights: the option is the remedy
    adata.uns["cape"]["hyperbolic_embedding"]["hierarchy_spearman"] = float("nan")
    assert "is undefined" in hierarchy_finding(adata).text
    adata.uns["cape"]["hyperbolic_embedding"]["params"] = {"positive_weight": "strongest_path_product/anchor_sum"}
    assert "per_anchor" not in hierarchy_finding(adata).text  # already in use: no remedy to offer


def test_kept_hierarchy_or_no_measurement_adds_no_finding():
    adata = ad.AnnData(np.zeros((3, 4), dtype=np.float32))
    assert hierarchy_finding(adata) is None  # Step II not run, or a file written before the measurement
    adata.uns["cape"] = {"hyperbolic_embedding": {"hierarchy_spearman": 0.8, "hierarchy_n_genes": 61}}
    assert hierarchy_finding(adata) is None
    adata.uns["cape"]["hyperbolic_embedding"].update(hierarchy_spearman=float("nan"), hierarchy_n_genes=0)
    assert hierarchy_finding(adata) is None  # no edge: the positions finding already says so
    assert all(f.topic != "hierarchy" for f in verdict(adata, []))
