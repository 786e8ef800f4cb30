"""Step I's threshold: ``tau="auto"``, the positioned-genes check, the threshold scan, CLI and config."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import cape.causal
from cape import CapeInputError
from cape.causal import CausalFit, is_dag, positioned_genes, tau_positioning
from cape.causal.postprocess import BUDGET_FDR
from cape.tl._causal_graph import AUTO_TAU_FLOOR, AUTO_TAU_MAX, SCAN_TAUS, causal_graph
from cape.workflow_config import coerce_config, validate_config

SCHEMA = Path(__file__).resolve().parent.parent / "configs" / "schema.yaml"
FAST = {"epochs": 2, "batch_size": 32, "device": "cpu"}


def _adata(n: int = 40, m: int = 20, seed: int = 0) -> ad.AnnData:
    X = np.abs(np.random.default_rng(seed).normal(size=(n, m))).astype(np.float32)
    return ad.AnnData(X=X, var=pd.DataFrame(index=[f"g{i}" for i in range(m)]),
                      obs=pd.DataFrame(index=[f"c{i}" for i in range(n)]))


def _weights(m: int = 20, top: float = 0.1, seed: int = 0) -> np.ndarray:
    """A learnt-looking adjacency: a few strong-ish edges, the rest small, scaled so that max |A| = top."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(m, m)) * (rng.random((m, m)) < 0.3) * rng.random((m, m)) ** 3
    np.fill_diagonal(A, 0)
    return (A * top / np.abs(A).max()).astype(np.float32)


@pytest.fixture
def fitted(monkeypatch):
    """Replace the fit by a given adjacency: the threshold logic is then exact and instant."""
    holder: dict[str, np.ndarray] = {}

    def fake_fit(X, **kwargs):
        return CausalFit(adjacency=holder["A"].copy(), history={"loss": [1.0]}, epochs_run=1)

    step1 = importlib.import_module("cape.causal.pipeline")
    monkeypatch.setattr(step1, "fit_variational_notears", fake_fit)  # where Step I looks it up
    return holder


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 15), seed=st.integers(0, 2**31 - 1), fraction=st.floats(0, 1), density=st.floats(0, 1))
def test_tau_positioning_is_the_largest_threshold_positioning_the_fraction(m: int, seed: int, fraction: float,
                                                                          density: float) -> None:
    rng = np.random.default_rng(seed)
    A = (rng.normal(size=(m, m)) * (rng.random((m, m)) < density)).astype(np.float32)
    tau = tau_positioning(A, fraction)
    need = max(1, int(np.ceil(fraction * m)))
    off = np.abs(A[~np.eye(m, dtype=bool)])
    if (off > 0).any():
        per_gene_nonzero = int(positioned_genes(A, 0.0).sum())
        assert positioned_genes(A, tau).sum() >= min(need, per_gene_nonzero)
        if per_gene_nonzero >= need:
            # Any larger threshold (the next float up is the k-th strongest gene's weight) positions fewer.
            above = float(np.nextafter(np.float32(tau), np.float32(np.inf)))
            assert positioned_genes(A, above).sum() < need
    else:
        assert tau == 0.0
    # make_dag keeps every positioned gene: its edge count and positioned genes agree with the mask.
    dag, _ = cape.causal.make_dag(A, tau)
    np.testing.assert_array_equal((dag != 0).any(0) | (dag != 0).any(1), positioned_genes(A, tau))


def test_auto_keeps_the_papers_tau_where_it_positions_enough(fitted) -> None:
    fitted["A"] = _weights(top=0.9)
    assert positioned_genes(fitted["A"], 0.2).mean() >= 0.5  # the premise
    a = _adata()
    causal_graph(a, tau="auto", **FAST)
    record = a.uns["cape"]["causal_graph"]
    assert record["params"]["tau"] == "auto" and record["tau_rule"] == "auto: paper"
    assert record["tau_used"] == AUTO_TAU_MAX
    np.testing.assert_array_equal(a.varp["cape_dag"].toarray(), cape.causal.make_dag(fitted["A"], 0.2)[0])


def test_auto_lowers_tau_until_half_the_genes_are_positioned(fitted, tmp_path) -> None:
    # The case: weights topping out near 0.1, so τ = 0.2 keeps nothing.
    fitted["A"] = _weights(top=0.1)
    a = _adata()
    causal_graph(a, tau="auto", **FAST)
    record = a.uns["cape"]["causal_graph"]
    dag = a.varp["cape_dag"].toarray()
    positioned = (dag != 0).any(0) | (dag != 0).any(1)
    assert is_dag(dag) and positioned.mean() >= 0.5
    assert record["tau_rule"] == "auto: positioning"
    assert AUTO_TAU_FLOOR <= record["tau_used"] < 0.1
    assert record["tau_used"] == tau_positioning(fitted["A"], 0.5)
    assert record["n_positioned"] == positioned.sum() and record["positioned_fraction"] == positioned.mean()
    assert record["n_edges"] == np.count_nonzero(dag) and record["max_weight"] == pytest.approx(0.1)
    scan = record["threshold_scan"]
    assert list(scan["tau"]) == sorted({*SCAN_TAUS, record["tau_used"]}, reverse=True)
    for t, edges, n_pos in zip(scan["tau"], scan["n_edges"], scan["n_positioned"], strict=True):
        expected = cape.causal.make_dag(fitted["A"], t)[0]
        assert edges == np.count_nonzero(expected) and n_pos == positioned_genes(fitted["A"], t).sum()
    assert scan["n_edges"][0] == 0  # τ = 0.2 would have kept nothing
    assert np.all(np.diff(scan["n_edges"]) >= 0)
    # The record survives an .h5ad round trip (a report reads it from the file).
    a.write_h5ad(tmp_path / "a.h5ad")
    back = ad.read_h5ad(tmp_path / "a.h5ad").uns["cape"]["causal_graph"]
    np.testing.assert_array_equal(back["threshold_scan"]["n_edges"], scan["n_edges"])
    assert back["tau_rule"] == "auto: positioning" and back["params"]["tau"] == "auto"


def test_auto_stops_with_one_line_when_the_weights_are_noise(fitted) -> None:
    fitted["A"] = _weights(top=0.004)
    a = _adata()
    with pytest.raises(CapeInputError) as err:
        causal_graph(a, tau="auto", **FAST)
    message = str(err.value)
    assert "\n" not in message
    assert "Step I kept 0 edges (0% of 20 genes positioned) at tau=0.01" in message
    assert "largest weight is 0.004" in message and "more cells (this run: 40 for 20 genes)" in message
    assert "use fewer genes (preprocess n_top_genes)" in message
    assert "cape_dag" not in a.varp and "cape" not in a.uns  # nothing half-written


def test_auto_names_the_screened_gene_count_beyond_the_low_rank_line(fitted, monkeypatch) -> None:
    import cape.causal.pipeline as pipeline

    monkeypatch.setattr(pipeline, "BUDGET_MAX_GENES", 10)  # 20 genes: the low-rank side of the line
    fitted["A"] = _weights(top=0.004)
    with pytest.raises(CapeInputError, match=r"use at most 10 genes \(preprocess n_top_genes\), where Step I screens"):
        causal_graph(_adata(), tau="auto", **FAST)


def test_tests_beyond_the_machine_memory_are_refused_before_any_work(monkeypatch) -> None:
    import cape.causal.pipeline as pipeline

    def no_fit(*_, **__):
        raise AssertionError("the fit ran")

    monkeypatch.setattr(pipeline, "fit_variational_notears", no_fit)
    a = _adata()
    need = pipeline.linalg_bytes(40, 20)
    monkeypatch.setattr(pipeline, "physical_memory", lambda: need - 1)
    with pytest.raises(CapeInputError) as err:
        causal_graph(a, **FAST)
    message = str(err.value)
    assert "\n" not in message and message.startswith("Step I's partial-correlation tests on 40 cells × 20 genes")
    assert "GB, more than this machine's" in message and "GB: use fewer genes (preprocess n_top_genes" in message
    assert "cape_dag" not in a.varp and "cape" not in a.uns  # nothing half-written
    # no test to run (the screen off, a fixed tau, no edge confidence), or no memory figure from the system: nothing
    # refused
    with pytest.raises(AssertionError, match="the fit ran"):
        causal_graph(a, screen="none", tau=0.05, edge_confidence=False, **FAST)
    with pytest.raises(CapeInputError, match="partial-correlation tests"):  # the confidence's shrunk inverse is one
        causal_graph(a, screen="none", tau=0.05, **FAST)
    monkeypatch.setattr(pipeline, "physical_memory", lambda: None)
    with pytest.raises(AssertionError, match="the fit ran"):
        causal_graph(a, **FAST)


def test_physical_memory_is_a_positive_byte_count_or_none() -> None:
    from cape._settings import physical_memory

    memory = physical_memory()
    assert memory is None or (isinstance(memory, int) and memory > 2**20)


def test_fixed_tau_warns_with_the_remedy_and_min_positioned_zero_is_silent(fitted, caplog) -> None:
    fitted["A"] = _weights(top=0.1)
    a = _adata()
    with caplog.at_level(logging.WARNING, logger="cape"):
        causal_graph(a, tau=0.2, **FAST)
    assert "Step I kept 0 edges" in caplog.text and "use tau=auto or tau≤0.0" in caplog.text
    assert a.uns["cape"]["causal_graph"]["tau_rule"] == "fixed" and a.varp["cape_dag"].nnz == 0
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cape"):
        causal_graph(a, min_positioned=0.0, **FAST)
    assert "Step I kept" not in caplog.text
    # weights all below the noise floor: no threshold would do, so tau=auto is not advised (it would fail)
    fitted["A"] = _weights(top=0.004)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cape"):
        causal_graph(a, tau=0.2, **FAST)
    assert "no threshold above the noise floor 0.01 positions 50% of the genes" in caplog.text
    assert "more cells (40 for 20 genes)" in caplog.text and "tau=auto" not in caplog.text
    assert a.uns["cape"]["causal_graph"]["tau_used"] == AUTO_TAU_MAX  # nothing asked: the paper's τ


@pytest.mark.parametrize("tau", ["automatic", "", True, 1.0, 1.5, -0.01, float("inf")])
def test_bad_tau_is_refused(tau) -> None:
    with pytest.raises(CapeInputError, match="tau must be a number in \\[0, 1\\), 'budget' or 'auto'"):
        causal_graph(_adata(), tau=tau, **FAST)


@pytest.mark.parametrize("fraction", [-0.1, 1.5, "half", True])
def test_bad_min_positioned_is_refused(fraction) -> None:
    with pytest.raises(CapeInputError, match="min_positioned"):
        causal_graph(_adata(), min_positioned=fraction, **FAST)


def test_cli_tau_auto_and_bad_tau(fitted, tmp_path, capsys) -> None:
    from cape.cli import main

    fitted["A"] = _weights(top=0.1)
    src = tmp_path / "in.h5ad"
    _adata().write_h5ad(src)
    out = tmp_path / "out.h5ad"
    assert main(["--quiet", "causal", "--input", str(src), "--output", str(out), "--tau", "auto",
                 "--epochs", "2"]) == 0
    record = ad.read_h5ad(out).uns["cape"]["causal_graph"]
    assert record["params"]["tau"] == "auto" and record["positioned_fraction"] >= 0.5
    capsys.readouterr()
    bad = tmp_path / "bad.h5ad"
    assert main(["--quiet", "causal", "--input", str(src), "--output", str(bad), "--tau", "1.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "cape: error: tau must be a number in [0, 1), 'budget' or 'auto', got 1.5"
    assert not bad.exists()
    # Weights at noise level under tau=auto: exit 2, one line, no output file.
    fitted["A"] = _weights(top=0.004)
    assert main(["--quiet", "causal", "--input", str(src), "--output", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cape: error: Step I kept 0 edges") and "\n" not in err and not bad.exists()
    with pytest.raises(SystemExit) as usage:
        main(["--quiet", "causal", "--input", str(src), "--output", str(bad), "--tau", "strong"])
    assert usage.value.code == 2


@pytest.mark.parametrize("key, value, ok", [
    *(("tau", value, ok) for value, ok in [("auto", True), ("budget", True), (0.05, True), ("0.05", True), (0, True),
                                           (".1", True), (1.5, False), ("1.5", False), ("autox", False),
                                           (-0.1, False)]),
    ("budget_fdr", 0.05, True), ("budget_fdr", 0, False), ("budget_fdr", 1, False), ("budget_test", "fisher", True),
    ("budget_test", "robust", True), ("budget_test", "both", True), ("budget_test", "spearman", False),
    ("budget_cells", 500, True), ("budget_fill_fdr", 0.2, True), ("budget_fill_fdr", None, True),
    ("budget_fill_fdr", 1, False),
    ("budget_cells", None, True), ("budget_cells", 0, False), ("budget_cells", "some", False)])
def test_schema_accepts_a_threshold_rule_or_a_number_in_unit_interval(key, value, ok) -> None:
    config = {"causal": {key: value}}
    coerce_config(config, SCHEMA)
    if ok:
        validate_config(config, SCHEMA)
    else:
        with pytest.raises(CapeInputError, match=f"causal.{key}"):
            validate_config(config, SCHEMA)


def test_default_config_uses_the_edge_budget() -> None:
    config = yaml.safe_load((SCHEMA.parent / "config.yaml").read_text())
    assert config["causal"]["tau"] == "budget"
    schema = yaml.safe_load(SCHEMA.read_text())
    assert schema["properties"]["causal"]["properties"]["tau"]["default"] == "budget"


# --- tau="budget" (the default): as many edges as significant partial correlations -----------------------------
def _chain_data(n: int = 400, m: int = 12, seed: int = 0) -> np.ndarray:
    """g0 → g1 → … → g5 (strong), g6 … independent."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, m))
    for j in range(1, 6):
        X[:, j] += X[:, j - 1]
    return X


def test_edge_budget_counts_the_significant_partial_correlations() -> None:
    from cape.causal import edge_budget, partial_correlations

    X = _chain_data()
    R = partial_correlations(X)
    assert R.shape == (12, 12) and np.all(np.diag(R) == 0) and np.allclose(R, R.T)
    assert np.all(np.abs(R[np.arange(5), np.arange(1, 6)]) > 0.4)  # the chain's pairs
    assert 5 <= edge_budget(X, 0.05) <= 7  # the 5 chain pairs (at 5 % FDR, rarely one more)
    assert 5 <= edge_budget(X, 0.05) <= edge_budget(X, 0.1) <= edge_budget(X) <= 12  # looser FDR, more pairs
    noise = np.random.default_rng(1).normal(size=(400, 12))
    assert edge_budget(noise, 0.05) <= 1 and edge_budget(noise) <= 7       # 66 null pairs
    assert edge_budget(X[:20]) is None  # fewer than genes + 10 cells: no test


def test_tau_for_edges_keeps_the_k_heaviest() -> None:
    from cape.causal import tau_for_edges, threshold

    A = np.array([[0, 0.5, 0.1], [0.3, 0, 0.2], [0.05, 0.4, 0]], dtype=np.float32)
    for k in range(1, 7):
        assert np.count_nonzero(threshold(A, tau_for_edges(A, k))) == k
    assert np.count_nonzero(threshold(A, tau_for_edges(A, 0))) == 0
    assert tau_for_edges(A, 100) == 0.0 or np.count_nonzero(threshold(A, tau_for_edges(A, 100))) == 6


def test_budget_keeps_as_many_edges_as_the_data_support(fitted, tmp_path) -> None:
    X = _chain_data()
    a = ad.AnnData(X.astype(np.float32), var=pd.DataFrame(index=[f"g{i}" for i in range(12)]))
    rng = np.random.default_rng(0)
    A = (rng.random((12, 12)) * 0.3).astype(np.float32)  # every weight above the floor: the budget decides
    np.fill_diagonal(A, 0)
    fitted["A"] = A
    causal_graph(a, min_positioned=0, **FAST)
    record = a.uns["cape"]["causal_graph"]
    k = record["edge_budget"]["n_pairs"]
    assert record["params"]["tau"] == "budget" and record["tau_rule"] == "budget"
    assert 5 <= k <= 7 and record["edge_budget"]["fdr"] == BUDGET_FDR == 0.05
    assert record["n_edges"] <= k and record["n_edges"] >= k - 2  # cycle breaking may drop a few
    # on unlabelled cells the default ranks pairs by their shrunk partial correlation: τ is the lightest kept weight
    assert record["params"]["pair_ranking"] == "auto"
    assert record["edge_budget"]["pair_ranking"] == "shrunk_partial_correlation"
    assert record["tau_used"] == pytest.approx(np.abs(a.varp["cape_dag"].data).min())
    causal_graph(a, min_positioned=0, pair_ranking="fit", **FAST)  # the fit's k heaviest weights alone
    assert a.uns["cape"]["causal_graph"]["tau_used"] == cape.causal.tau_for_edges(A, k)
    a.write_h5ad(tmp_path / "a.h5ad")  # the record survives the file
    assert ad.read_h5ad(tmp_path / "a.h5ad").uns["cape"]["causal_graph"]["tau_rule"] == "budget"


def test_budget_with_few_genes_positioned_informs_and_does_not_warn(fitted, caplog) -> None:
    a = ad.AnnData(_chain_data().astype(np.float32), var=pd.DataFrame(index=[f"g{i}" for i in range(12)]))
    A = np.zeros((12, 12), dtype=np.float32)
    A[0, 1] = 0.5  # one edge the budget keeps: 2 of 12 genes positioned, under min_positioned's half
    fitted["A"] = A
    with caplog.at_level(logging.INFO, logger="cape"):
        causal_graph(a, **FAST)
    record = a.uns["cape"]["causal_graph"]
    assert record["tau_rule"] == "budget" and record["n_positioned"] < 0.5 * 12
    kept = [r for r in caplog.records if "Step I kept" in r.getMessage()]
    assert kept and all(r.levelno == logging.INFO for r in kept)


def test_budget_fdr_sets_the_rate_of_the_budget_test(fitted, tmp_path, capsys) -> None:
    from cape.cli import main

    X = _chain_data(seed=3)
    X[:, 6:] += 0.15 * X[:, [0]]  # weak dependence: significant at a loose rate, not at a strict one
    X -= X.min(axis=0)  # non-negative, as the CLI expects; partial correlations do not change
    a = ad.AnnData(X.astype(np.float32), var=pd.DataFrame(index=[f"g{i}" for i in range(12)]))
    A = (np.random.default_rng(0).random((12, 12)) * 0.3).astype(np.float32)
    np.fill_diagonal(A, 0)
    fitted["A"] = A
    pairs = {}
    for fdr in (0.001, 0.3):
        causal_graph(a, min_positioned=0, budget_fdr=fdr, **FAST)
        record = a.uns["cape"]["causal_graph"]
        pairs[fdr] = record["edge_budget"]["n_pairs"]
        assert pairs[fdr] == cape.causal.edge_budget(X, fdr)
        assert record["edge_budget"]["fdr"] == record["params"]["budget_fdr"] == fdr
    assert pairs[0.001] < pairs[0.3]
    src, out = tmp_path / "in.h5ad", tmp_path / "out.h5ad"
    a.write_h5ad(src)
    assert main(["--quiet", "causal", "--input", str(src), "--output", str(out), "--budget-fdr", "0.001",
                 "--min-positioned", "0", "--epochs", "2"]) == 0
    assert ad.read_h5ad(out).uns["cape"]["causal_graph"]["edge_budget"]["n_pairs"] == pairs[0.001]
    capsys.readouterr()
    bad = tmp_path / "bad.h5ad"
    assert main(["--quiet", "causal", "--input", str(src), "--output", str(bad), "--budget-fdr", "1"]) == 2
    assert capsys.readouterr().err.strip() == "cape: error: budget_fdr must be a rate in (0, 1), got 1.0"
    assert not bad.exists()


def test_budget_fill_fdr_fills_a_short_count_and_none_turns_it_off(fitted, tmp_path, capsys) -> None:
    from cape.cli import main

    rng = np.random.default_rng(0)  # g0 → g1 → … → g11, weak: 7 pairs pass at 5 %, 14 at 20 %
    X = rng.normal(size=(300, 12))
    for j in range(1, 12):
        X[:, j] += 0.22 * X[:, j - 1]
    X -= X.min(axis=0)
    a = ad.AnnData(X.astype(np.float32), var=pd.DataFrame(index=[f"g{i}" for i in range(12)]))
    A = (np.random.default_rng(0).random((12, 12)) * 0.3).astype(np.float32)
    np.fill_diagonal(A, 0)
    fitted["A"] = A
    src = tmp_path / "in.h5ad"
    a.write_h5ad(src)
    budgets = {}
    for flag in ("0.2", "none"):
        out = tmp_path / f"out_{flag}.h5ad"
        assert main(["--quiet", "causal", "--input", str(src), "--output", str(out), "--budget-fill-fdr", flag,
                     "--min-positioned", "0", "--epochs", "2"]) == 0
        record = ad.read_h5ad(out).uns["cape"]["causal_graph"]
        budgets[flag] = record["edge_budget"]
        assert record["params"]["budget_fill_fdr"] == (0.2 if flag == "0.2" else "none")
    strict = budgets["none"]["n_pairs"]
    assert strict == budgets["0.2"]["n_pairs_strict"] < 12 and "filled" not in budgets["none"]
    assert budgets["0.2"]["filled"] and strict < budgets["0.2"]["n_pairs"] <= 12
    capsys.readouterr()
    bad = tmp_path / "bad.h5ad"
    with pytest.raises(SystemExit) as usage:  # an argparse usage error
        main(["--quiet", "causal", "--input", str(src), "--output", str(bad), "--budget-fill-fdr", "loose"])
    assert usage.value.code == 2
    assert "budget-fill-fdr must be a rate in (0, 1) or 'none'" in capsys.readouterr().err
    assert main(["--quiet", "causal", "--input", str(src), "--output", str(bad), "--budget-fill-fdr", "1"]) == 2
    assert capsys.readouterr().err.strip() == ("cape: error: budget_fill_fdr must be a rate in (0, 1) or None "
                                               "(no fill), got 1.0")
    assert not bad.exists()


def test_budget_test_chooses_how_the_budget_counts(fitted, tmp_path, capsys) -> None:
    from cape.cli import main

    rng = np.random.default_rng(5)
    group = rng.integers(0, 5, 600)
    X = rng.normal(size=(600, 40)) * np.exp(rng.normal(0.0, 2.0, size=(5, 40)))[group]  # independent genes
    X -= X.min(axis=0)
    a = ad.AnnData(X.astype(np.float32), var=pd.DataFrame(index=[f"g{i}" for i in range(40)]))
    A = (rng.random((40, 40)) * 0.3).astype(np.float32)
    np.fill_diagonal(A, 0)
    fitted["A"] = A
    counts = {}
    for test in ("fisher", "robust", "both"):
        # at the former default rate, 30 %, where Fisher's surplus on these nulls is plain
        causal_graph(a, min_positioned=0, budget_test=test, budget_fdr=0.3, **FAST)
        record = a.uns["cape"]["causal_graph"]
        counts[test] = record["edge_budget"].get("n_pairs", 0)
        assert record["edge_budget"]["test"] == record["params"]["budget_test"] == test
        assert record["edge_budget"]["n_pairs_tested"] == 40 * 39 // 2
        assert counts[test] == cape.causal.edge_budget(X, 0.3, test=test)
    # Fisher's z counts independent genes whose spread varies
    assert counts["both"] <= counts["robust"] <= 2 and counts["fisher"] >= 10
    src, out = tmp_path / "in.h5ad", tmp_path / "out.h5ad"
    a.write_h5ad(src)
    assert main(["--quiet", "causal", "--input", str(src), "--output", str(out), "--budget-test", "fisher",
                 "--budget-fdr", "0.3", "--min-positioned", "0", "--epochs", "2"]) == 0
    assert ad.read_h5ad(out).uns["cape"]["causal_graph"]["edge_budget"]["n_pairs"] == counts["fisher"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as usage:
        main(["--quiet", "causal", "--input", str(src), "--output", str(tmp_path / "bad.h5ad"),
              "--budget-test", "spearman"])
    assert usage.value.code == 2 and "--budget-test: invalid choice: 'spearman'" in capsys.readouterr().err
    assert not (tmp_path / "bad.h5ad").exists()


def test_budget_rows_caps_the_cells_at_the_larger_of_the_cap_and_ten_per_gene() -> None:
    from cape.causal import BUDGET_CELLS, budget_rows

    assert budget_rows(BUDGET_CELLS, 200) is None and budget_rows(10**6, 50, None) is None  # within the cap; off
    rows = budget_rows(5000, 50, 2000, seed=3)
    assert rows.size == 2000 and np.all(np.diff(rows) > 0) and rows.min() >= 0 and rows.max() < 5000
    assert np.array_equal(rows, budget_rows(5000, 50, 2000, seed=3))  # the seed fixes the draw ...
    assert not np.array_equal(rows, budget_rows(5000, 50, 2000, seed=4))  # ... and another seed draws anew
    assert budget_rows(5000, 300, 2000).size == 3000  # 10 per gene beyond the cap
    assert budget_rows(3000, 300, 2000) is None and budget_rows(5000, 300, 100).size == 3000
    with pytest.raises(ValueError, match="max_cells"):
        budget_rows(5000, 50, 0)


def test_budget_counts_on_a_seeded_subset_of_many_cells(fitted, tmp_path, capsys) -> None:
    from cape.causal import budget_rows, decoy_count, edge_budget, fill_budget
    from cape.cli import main

    # A chain plus a weak common factor on the other genes: on 12,000 cells those weak partial correlations are
    # significant, on 2,000 they mostly are not, so that a count on every cell grows with the cells.
    X = _chain_data(n=12000, seed=5)
    X[:, 6:] += 0.2 * np.random.default_rng(6).normal(size=(12000, 1))
    X -= X.min(axis=0)
    a = ad.AnnData(X.astype(np.float32), var=pd.DataFrame(index=[f"g{i}" for i in range(12)]))
    A = (np.random.default_rng(0).random((12, 12)) * 0.3).astype(np.float32)
    np.fill_diagonal(A, 0)
    fitted["A"] = A
    records = {}
    for cells in (2000, None):
        causal_graph(a, min_positioned=0, budget_cells=cells, seed=7, **FAST)
        records[cells] = a.uns["cape"]["causal_graph"]["edge_budget"]
    rows = budget_rows(12000, 12, 2000, seed=7)
    for cells, tested in ((2000, X[rows]), (None, X)):  # the significant pairs less those of the permuted copy
        assert records[cells]["n_pairs_significant"] == edge_budget(tested, BUDGET_FDR)
        assert records[cells]["n_pairs_permuted"] == decoy_count(tested, BUDGET_FDR, seed=7)
        record = records[cells]
        assert record["n_pairs_strict"] == record["n_pairs_significant"] - record["n_pairs_permuted"]
        loose = record["n_pairs_significant_fill"] - record["n_pairs_permuted_fill"]
        assert record["n_pairs"] == fill_budget(record["n_pairs_strict"], loose, 12)
        assert record["filled"] == (record["n_pairs"] > record["n_pairs_strict"])
    assert records[2000]["n_pairs"] < records[None]["n_pairs"]
    assert records[2000]["n_cells_tested"] == 2000 and records[2000]["cells_tested"] == "random subset (seed 7)"
    assert records[None]["n_cells_tested"] == 12000 and records[None]["cells_tested"] == "all"
    assert a.uns["cape"]["causal_graph"]["params"]["budget_cells"] == "all"
    sparse = ad.AnnData(sp.csr_matrix(a.X), var=a.var.copy())  # counts arrive sparse: the same rows, the same count
    causal_graph(sparse, min_positioned=0, seed=7, **FAST)
    assert sparse.uns["cape"]["causal_graph"]["edge_budget"] == records[2000]
    src, out = tmp_path / "in.h5ad", tmp_path / "out.h5ad"
    a.write_h5ad(src)
    assert main(["--quiet", "--seed", "7", "causal", "--input", str(src), "--output", str(out), "--min-positioned",
                 "0", "--epochs", "2", "--budget-cells", "all"]) == 0
    assert ad.read_h5ad(out).uns["cape"]["causal_graph"]["edge_budget"]["n_pairs"] == records[None]["n_pairs"]
    capsys.readouterr()
    bad = tmp_path / "bad.h5ad"
    with pytest.raises(SystemExit) as usage:
        main(["--quiet", "causal", "--input", str(src), "--output", str(bad), "--budget-cells", "0"])
    assert usage.value.code == 2 and "budget-cells" in capsys.readouterr().err and not bad.exists()


def test_budget_falls_back_to_auto_without_enough_cells_or_signal(fitted, caplog) -> None:
    fitted["A"] = _weights(top=0.9)
    a = _adata(n=25, m=20)  # 25 < 20 + 10 cells: no test
    causal_graph(a, **FAST)
    record = a.uns["cape"]["causal_graph"]
    assert record["tau_rule"] == "auto: paper" and "fewer than genes + 10 cells" in record["edge_budget"]["fallback"]
    b = _adata(n=200, m=10)  # independent genes: (almost surely) no significant pair
    fitted["A"] = _weights(m=10, top=0.9)
    with caplog.at_level(logging.WARNING, logger="cape"):
        causal_graph(b, **FAST)
    record = b.uns["cape"]["causal_graph"]
    if record["edge_budget"].get("n_pairs") == 0:
        assert record["tau_rule"].startswith("auto") and "no gene pair has a significant" in caplog.text


@pytest.mark.slow
def test_default_step_one_positions_half_of_a_few_cell_tpm_set() -> None:
    # The shape: 184 SMART-seq-like cells × 9,450 genes, the workflow's preprocessing (300 HVGs).
    # Fitted weights stay below 0.2 here, so τ = 0.2 would keep no edge at all.
    import cape

    a = cape.data.simulate_expression(184, 9450, kind="tpm", seed=0)
    cape.pp.preprocess(a, min_genes=200, target_sum=1e4, n_top_genes=300, hvg_flavor="seurat")
    causal_graph(a, device="cpu", seed=0)
    record = a.uns["cape"]["causal_graph"]
    scan = dict(zip(record["threshold_scan"]["tau"], record["threshold_scan"]["n_edges"], strict=True))
    assert scan[0.2] == 0 and record["tau_rule"] == "auto: positioning"
    assert record["positioned_fraction"] >= 0.5 and record["n_edges"] > 0


@pytest.mark.parametrize(("model", "m", "rank", "lam", "rank_used", "lam_used"), [
    ("variational", 20, "auto", None, None, 0.3),        # dense up to DENSE_MAX_GENES, λs 0.3
    ("variational", 20, 5, None, 5, 1.0),                # an explicit low rank: the paper's λs
    ("paper", 60, "auto", None, 40, 1.0),                # the paper's Step I
    ("paper", 20, "auto", None, None, 1.0),              # rank 40 ≥ 20 genes: dense, λs still the paper's
    ("variational", 20, "auto", 2.0, None, 2.0),         # an explicit λs is kept
])
def test_rank_and_lambda_defaults_follow_the_model_and_gene_count(monkeypatch, model, m, rank, lam, rank_used,
                                                                  lam_used) -> None:
    seen = {}

    def fake_fit(X, **kwargs):
        seen.update(kwargs)
        return CausalFit(adjacency=_weights(m=X.shape[1], top=0.9), history={"loss": [1.0]}, epochs_run=1)

    monkeypatch.setattr(importlib.import_module("cape.causal.pipeline"), "fit_variational_notears", fake_fit)
    a = _adata(n=200, m=m)
    causal_graph(a, model=model, rank=rank, lambda_sparse=lam, tau=0.2, **FAST)
    record = a.uns["cape"]["causal_graph"]
    assert seen["rank"] == rank_used and seen["lambda_sparse"] == lam_used
    assert record["lambda_sparse_used"] == lam_used and record["params"]["model"] == model
    with pytest.raises(CapeInputError, match="rank must be a positive integer, None \\(dense\\) or 'auto'"):
        causal_graph(a, rank="low", **FAST)


def test_screen_candidates_are_both_directions_of_the_significant_pairs() -> None:
    from cape.causal import screen_candidates

    X = _chain_data()
    C = screen_candidates(X)
    assert C.shape == (12, 12) and np.array_equal(C, C.T) and not C.diagonal().any()
    assert all(C[j - 1, j] for j in range(1, 6))  # the chain's pairs are candidates
    assert C.sum() // 2 <= 12  # few others at 20 % FDR
    assert screen_candidates(X[:15]) is None  # no test with fewer than genes + 10 cells


def test_dense_fit_is_restricted_to_the_screened_candidates(monkeypatch) -> None:
    seen = {}

    def fake_fit(X, **kwargs):
        seen.update(kwargs)
        return CausalFit(adjacency=_weights(m=X.shape[1], top=0.9), history={"loss": [1.0]}, epochs_run=1)

    monkeypatch.setattr(importlib.import_module("cape.causal.pipeline"), "fit_variational_notears", fake_fit)
    a = ad.AnnData(_chain_data().astype(np.float32), var=pd.DataFrame(index=[f"g{i}" for i in range(12)]))
    causal_graph(a, tau=0.2, **FAST)
    record = a.uns["cape"]["causal_graph"]
    assert seen["candidates"][0, 1] and record["screening"]["n_candidate_pairs"] == seen["candidates"].sum() // 2
    causal_graph(a, tau=0.2, screen="none", **FAST)
    assert seen["candidates"] is None and "screening" not in a.uns["cape"]["causal_graph"]
    with pytest.raises(CapeInputError, match="screen must be one of"):
        causal_graph(a, screen="lasso", **FAST)


def test_candidates_keep_a_dense_a_at_zero_elsewhere() -> None:
    from cape.causal import fit_variational_notears

    X = _chain_data(n=300, m=6)
    allowed = np.zeros((6, 6), dtype=bool)
    allowed[0, 1] = allowed[1, 0] = True
    fit = fit_variational_notears(X.astype(np.float32), rank=None, epochs=3, batch_size=64, device="cpu",
                                  candidates=allowed)
    assert np.all(fit.adjacency[~allowed] == 0) and np.abs(fit.adjacency[allowed]).max() > 0
    with pytest.raises(ValueError, match="dense A only"):
        fit_variational_notears(X.astype(np.float32), rank=2, epochs=1, device="cpu", candidates=allowed)


def test_beyond_the_dense_size_screening_keeps_a_sparse_dense_a(monkeypatch) -> None:
    # The 12-gene chain stands in for a large gene set: the size thresholds are lowered to 8 genes and rank 3.
    config_module = importlib.import_module("cape.causal.causal_config")
    monkeypatch.setattr(config_module, "DENSE_MAX_GENES", 8)
    monkeypatch.setattr(config_module, "LOW_RANK", 3)
    monkeypatch.setattr(importlib.import_module("cape.causal.trainer"), "SPARSE_MIN_GENES", 8)
    a = ad.AnnData(_chain_data().astype(np.float32), var=pd.DataFrame(index=[f"g{i}" for i in range(12)]))
    causal_graph(a, **FAST)
    record = a.uns["cape"]["causal_graph"]
    assert record["rank_used"] == "dense" and record["sparse_adjacency"]
    assert record["screening"]["n_candidate_pairs"] > 0 and record["n_edges"] > 0
    # Without candidates (screen off, or too few cells for the test) it is the paper's low-rank A.
    causal_graph(a, screen="none", **FAST)
    record = a.uns["cape"]["causal_graph"]
    assert record["rank_used"] == 3 and not record["sparse_adjacency"]
    small = a[:15].copy()
    causal_graph(small, min_positioned=0, **FAST)
    record = small.uns["cape"]["causal_graph"]
    assert record["rank_used"] == 3 and "A = UVᵀ of rank 3" in record["screening"]["fallback"]
