"""``cape-bench causal --panel counts``: each member's counts, BoolODE's rule activity, the settings, the outputs."""

from __future__ import annotations

import json
from itertools import combinations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from cape_benchmarks import count_panel
from cape_benchmarks.boolode import hill_activity, random_dag_max_parents, simulate_boolode
from cape_benchmarks.cli import main
from cape_benchmarks.sergio import sergio_python

TINY = {"n_cells": 120, "n_genes": 12, "n_edges": 15}


def _members() -> list[str]:
    return [m for m in count_panel.MEMBERS if m != "sergio" or sergio_python() is not None]


@pytest.mark.parametrize("setting", ["boolode", "bn_counts_types8", "grn_cells_depth1k", "boolode_disp20",
                                     "bn_counts_weak", "grn_cells_types1"])
def test_each_member_gives_integer_counts_on_a_known_dag_with_its_parameters(setting) -> None:
    spec = count_panel.panel_settings()[setting]
    counts, W, params = count_panel.simulate_member(spec, 3, **TINY)
    assert counts.ndim == 2 and counts.shape[0] == TINY["n_cells"] and counts.shape[1] == W.shape[0] == W.shape[1]
    assert counts.dtype.kind == "i" and counts.min() >= 0 and counts.sum() > 0
    assert np.count_nonzero(W) > 0 and nx.is_directed_acyclic_graph(nx.from_numpy_array(W != 0,
                                                                                          create_using=nx.DiGraph))
    assert params == {k: v for k, v in spec.items() if k != "member"}
    again, W_again, _ = count_panel.simulate_member(spec, 3, **TINY)  # seeded
    np.testing.assert_array_equal(counts, again)
    np.testing.assert_array_equal(W, W_again)


@pytest.mark.skipif(sergio_python() is None, reason="SERGIO is not installed (make sergio-env)")
def test_sergio_member_records_its_noise_level() -> None:
    spec = count_panel.panel_settings()["sergio_ds3"]
    counts, W, params = count_panel.simulate_member(spec, 0, **TINY)
    assert counts.shape == (TINY["n_cells"] // 3 * 3, W.shape[0]) and counts.min() >= 0
    assert np.allclose(counts, np.round(counts))
    assert params["sergio_noise"] == list(count_panel.SERGIO_NOISE["ds3"]) and "dispersion" not in params


def test_the_settings_vary_one_parameter_at_a_time() -> None:
    settings = count_panel.panel_settings()
    assert {s for s in settings if "_" not in s or s in count_panel.MEMBERS} == set(count_panel.MEMBERS)
    for name, spec in settings.items():
        changed = {k for k, v in count_panel.BASE.items() if spec.get(k) != v}
        assert len(changed) + ("noise" in spec) <= 1, name
    assert settings["boolode_types8"]["n_types"] == 8 and settings["grn_cells_depth20k"]["depth"] == 20000.0
    assert "sergio_disp1" not in settings and {"sergio_ds1", "sergio_ds2", "sergio_ds3"} <= set(settings)


def test_the_rule_activity_is_boolodes_sum_over_regulator_sets() -> None:
    rng = np.random.default_rng(0)
    signs = np.array([1.0, 1.0, -1.0])  # two activators and a repressor of gene 3
    k, n = np.array([8.0, 12.0, 10.0]), 2.0
    p = rng.uniform(0, 20, (5, 4))
    sources = np.arange(3)
    act = sp.csr_matrix(((signs > 0).astype(float), (sources, [3, 3, 3])), shape=(3, 4))
    rep = sp.csr_matrix(((signs < 0).astype(float), (sources, [3, 3, 3])), shape=(3, 4))
    f = hill_activity(p, sources, k, n, act, rep, np.array([False, False, False, True]))[:, 3]
    h = (p[:, :3] / k) ** n
    num, den = np.zeros(5), np.ones(5)  # α_0 = 0: the rule (a or b) and not r is false with all off
    for size in (1, 2, 3):
        for S in combinations(range(3), size):
            term = np.prod(h[:, list(S)], axis=1)
            alpha = any(signs[j] > 0 for j in S) and not any(signs[j] < 0 for j in S)
            num, den = num + alpha * term, den + term
    np.testing.assert_allclose(f, num / den)


def test_boolode_dag_respects_the_parent_cap_and_cell_types_differ() -> None:
    W = random_dag_max_parents(30, 50, 3, np.random.default_rng(1))
    assert np.count_nonzero(W) == 50 and (W != 0).sum(0).max() <= 3
    counts, W, types = simulate_boolode(0, n_cells=200, n_genes=15, n_edges=20, n_types=3, t_end=1.0)
    assert counts.shape == (200, 15) and set(types) == {0, 1, 2}
    means = np.array([counts[types == t].mean(0) for t in range(3)])
    assert np.abs(np.log1p(means[0]) - np.log1p(means[1])).max() > 0.5


def test_the_panel_writes_its_records_table_and_figure(tmp_path) -> None:
    code = main(["--threads", "1", "causal", "--panel", "counts", "--quick", "--out", str(tmp_path),
                 "--settings", "boolode,grn_cells_types1", "--methods",
                 "cape_default,partial_correlation,partial_correlation_true", "--cells", "150", "--genes", "12",
                 "--taus", "budget0.05,budget0.3"])
    assert code == 0
    records = json.loads((tmp_path / "count_panel.json").read_text())
    assert {r["setting"] for r in records} == {"boolode", "grn_cells_types1"}
    assert {r["method"] for r in records} == {"cape_default", "partial_correlation", "partial_correlation_true",
                                              "cape_default@τbudget0.05", "cape_default@τbudget0.3"}
    kept = {(r["setting"], r["method"]): r["value"] for r in records if r["metric"] == "kept"}
    for setting in ("boolode", "grn_cells_types1"):  # the same fit cut at the default rate gives the default graph
        assert kept[setting, "cape_default"] == kept[setting, "cape_default@τbudget0.05"]
        assert kept[setting, "cape_default@τbudget0.05"] <= kept[setting, "cape_default@τbudget0.3"]
    true_count = {r["value"] for r in records if r["metric"] == "true_edges"}
    kept_true = [r["value"] for r in records if r["metric"] == "kept" and r["method"] == "partial_correlation_true"]
    assert len(true_count) >= 1 and set(kept_true) <= true_count
    assert all(r["params"]["n_types"] in (1, 3) for r in records)
    text = (tmp_path / "count_panel.md").read_text()
    assert "## Median per member" in text and "| boolode | cape_default |" in text
    assert "## Against issue 54's figures (cape_default)" in text and "| grn_cells_types1 | " in text
    assert (tmp_path / "count_panel.png").stat().st_size > 0
    assert (tmp_path / "count_panel_members.png").stat().st_size > 0


def test_the_figure_shows_the_metric_each_issue_figure_is_checked_on() -> None:
    rows = [("a", m, 0, k, v) for m in ("cape_default", "partial_correlation")
            for k, v in (("kept", 10), ("true_edges", 10), ("skeleton_f1", 0.5), ("skeleton_auprc", 0.4), ("f1", 0.3),
                         ("ordered_confidence_gap_closed", 0.6))]
    fig = count_panel.panel_figure(_records(rows))
    assert [ax.get_xlabel() for ax in fig.axes] == [f"median {f[1]}" for f in count_panel.ISSUE_FIGURES]


def test_unknown_panel_settings_are_refused(tmp_path) -> None:
    with pytest.raises(count_panel.CapeInputError, match="nope"):
        count_panel.run_count_panel(tmp_path, quick=True, settings=["nope"])


@pytest.mark.slow
@pytest.mark.parametrize("member", _members())
def test_each_member_runs_quick_with_every_in_process_method(member, tmp_path) -> None:
    records = count_panel.run_count_panel(tmp_path, quick=True, settings=[member])
    assert {r["method"] for r in records} == {"cape_default", "partial_correlation", "partial_correlation_true",
                                              "graphical_lasso"}


def _records(rows: list[tuple[str, str, int, str, float]]) -> list[dict]:
    return [{"setting": s, "member": s.split("_")[0], "method": m, "seed": seed, "metric": k, "value": v,
             "status": "ok"} for s, m, seed, k, v in rows]


def test_figure_checks_hold_step1_against_the_best_peer_and_the_fixed_bounds() -> None:
    rows = []
    for seed, (kept, true) in enumerate([(150, 100), (300, 100), (500, 200)]):  # kept / true 1.5, 3.0, 2.5: median 2.5
        rows += [("a", "cape_default", seed, "kept", kept), ("a", "cape_default", seed, "true_edges", true)]
    rows += [("a", "cape_default", s, "skeleton_f1", v) for s, v in enumerate([0.40, 0.50, 0.45])]
    rows += [("a", "partial_correlation", s, "skeleton_f1", v) for s, v in enumerate([0.44, 0.46, 0.47])]
    rows += [("a", "cape_default", 0, "skeleton_auprc", 0.31), ("a", "partial_correlation", 0, "skeleton_auprc", 0.30),
             ("a", "grnboost2", 0, "skeleton_auprc", 0.33)]  # 0.31 ≥ 0.33 − 0.02: met at the margin
    rows += [("a", "cape_default", 0, "f1", 0.2), ("a", "cape_default", 0, "ordered_confidence_gap_closed", 0.5)]
    rows += [("b", "cape_default", 0, k, v) for k, v in (("kept", 10), ("true_edges", 10), ("skeleton_f1", 0.9))]
    records = [*_records(rows), {**_records([("a", "grnboost2", 1, "skeleton_auprc", 9.0)])[0], "status": "failed"}]
    checks = count_panel.figure_checks(records).set_index(["setting", "figure"])
    names = [f[0] for f in count_panel.ISSUE_FIGURES]
    assert checks.loc[("a", names[0]), "value"] == pytest.approx(2.5) and checks.loc[("a", names[0]), "met"] is False
    assert checks.loc[("a", names[1]), "against"] == pytest.approx(0.46) and checks.loc[("a", names[1]), "met"] is False
    assert checks.loc[("a", names[2]), "against"] == pytest.approx(0.33) and checks.loc[("a", names[2]), "met"] is True
    assert checks.loc[("a", names[3]), "met"] is None  # DAGMA-linear did not run
    assert checks.loc[("a", names[4]), "met"] is True  # at the bound
    assert checks.loc[("b", names[0]), "met"] is True and checks.loc[("b", names[1]), "met"] is None
    # the leads, paired by seed: 2 − (1.5, 3, 2.5) and (0.40, 0.50, 0.45) − (0.44, 0.46, 0.47), each mean ± t(2)·SE
    for figure, leads in ((names[0], [0.5, -1.0, -0.5]), (names[1], [-0.04, 0.04, -0.02])):
        row = checks.loc[("a", figure)]
        half = 4.302653 * np.std(leads, ddof=1) / np.sqrt(3)
        assert row["lead"] == pytest.approx(np.mean(leads)) and row["seeds"] == 3
        assert (row["lead_low"], row["lead_high"]) == pytest.approx((np.mean(leads) - half, np.mean(leads) + half))
        assert row["within_noise"] is True
    # one seed: a lead (0.31 − (0.33 − 0.02)), no interval; the failed grnboost2 seed is not paired
    row = checks.loc[("a", names[2])]
    assert row["lead"] == pytest.approx(0.0) and row["seeds"] == 1 and row["within_noise"] is None
    assert checks.loc[("a", names[3]), "seeds"] == 0 and np.isnan(checks.loc[("a", names[3]), "lead"])
    text = count_panel.figures_report(records)
    assert "| a | **2.5 / 2** ~ | **0.45 / 0.46** ~ | 0.31 / 0.33 | – | 0.5 / 0.5 |" in text
    assert ("- kept ≤ 2 × true: met in 1 of 2 settings; within the seeds' noise: 0 of the 1 met, 1 of the 1 missed"
            in text)
    assert "- directed F1 ≥ DAGMA-linear: met in 0 of 0 settings (2 could not be checked)" in text
    assert count_panel.figures_report(_records([("a", "partial_correlation", 0, "kept", 1.0)])) == ""


def test_a_miss_beyond_the_seeds_spread_is_not_within_noise() -> None:
    """Step I below the peer on every seed, by more than the spread: missed, and the interval excludes 0; the same
    leads shifted above 0 are met, outside noise too; the lead does not depend on the order of the records."""
    ours, theirs = [0.40, 0.42, 0.41, 0.43, 0.39], [0.50, 0.51, 0.52, 0.50, 0.53]
    rows = [("a", "cape_default", s, "skeleton_f1", v) for s, v in enumerate(ours)]
    rows += [("a", "partial_correlation", s, "skeleton_f1", v) for s, v in enumerate(theirs)]
    rows += [("b", "cape_default", s, "skeleton_f1", v + 0.2) for s, v in enumerate(ours)]
    rows += [("b", "partial_correlation", s, "skeleton_f1", v) for s, v in enumerate(theirs)]
    name = count_panel.ISSUE_FIGURES[1][0]
    checks = count_panel.figure_checks(_records(rows)).set_index(["setting", "figure"])
    shuffled = count_panel.figure_checks(_records(rows[::-1])).set_index(["setting", "figure"])
    a, b = checks.loc[("a", name)], checks.loc[("b", name)]
    assert a["met"] is False and a["lead_high"] < 0 and a["within_noise"] is False
    assert b["met"] is True and b["lead_low"] > 0 and b["within_noise"] is False
    assert a["lead"] == pytest.approx(np.mean(np.subtract(ours, theirs)))
    assert b["lead"] - a["lead"] == pytest.approx(0.2)
    assert shuffled.loc[("a", name), "lead"] == pytest.approx(a["lead"])
    text = count_panel.figures_report(_records(rows))
    assert "| a | – | **0.41 / 0.51** |" in text
    assert "within the seeds' noise: 0 of the 1 met, 0 of the 1 missed" in text
