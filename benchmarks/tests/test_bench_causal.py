"""Peer subprocess runner, the causal benchmarks' outputs (tiny settings) and pl.dag_comparison."""

from __future__ import annotations

import json

import matplotlib
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from cape._errors import CapeInputError
from cape.causal import BUDGET_FILL_FDR, CausalConfig, count_budget, decoy_count, learn_causal_graph
from cape.data.simulate import simulate_sem
from cape_benchmarks import causal as bench_causal
from cape_benchmarks import causal_scale
from cape_benchmarks.count_panel import log_normalised, panel_settings, simulate_member
from cape_benchmarks.peers import PeerResult, run_peer

matplotlib.use("Agg")


def test_peer_runs_in_a_subprocess_without_touching_our_dtype() -> None:
    a = simulate_sem(5, 6, 300, graph="scale_free", sem="linear", seed=1)
    result = run_peer("dagma_linear", a.X, budget=120, seed=0)
    assert result.status == "ok", result.message
    assert result.adjacency.shape == (5, 5) and result.seconds > 0
    assert torch.get_default_dtype() == torch.float32
    with pytest.raises(ValueError):
        run_peer("nope", a.X, budget=1)


def test_peer_over_budget_is_stopped() -> None:
    X = np.random.default_rng(0).normal(size=(500, 6))
    result = run_peer("golem", X, budget=1.0)
    assert result.status == "timeout" and result.adjacency is None and result.seconds < 30


@pytest.mark.slow  # an end-to-end benchmark run (records, table, plot): `pytest -m slow`
def test_benchmark_writes_records_table_and_plot(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(bench_causal.SETTINGS, "tiny", {"kind": "sem", "n_nodes": 4, "n_samples": 200})
    records = bench_causal.run_causal_benchmark(out=tmp_path, settings=["tiny"], methods=["cape_dense"],
                                                n_seeds=2, budget=5)
    assert {r["metric"] for r in records} == {"seconds", "acyclic", *bench_causal.METRICS}
    assert {r["seed"] for r in records} == {0, 1}
    saved = json.loads((tmp_path / "causal.json").read_text())
    assert len(saved) == len(records)
    assert "cape_dense" in (tmp_path / "causal.md").read_text()
    assert (tmp_path / "causal.png").stat().st_size > 1000


@pytest.mark.slow  # an end-to-end benchmark run (records, table, plot): `pytest -m slow`
def test_scale_benchmark_tiny_grid(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(causal_scale.QUICK, "N", [300])
    monkeypatch.setitem(causal_scale.QUICK, "M", [45])
    monkeypatch.setitem(causal_scale.QUICK, "dense_max_M", 45)
    monkeypatch.setitem(causal_scale.QUICK, "h_M", [50])
    monkeypatch.setitem(causal_scale.QUICK, "fit", [(300, 45)])
    monkeypatch.setitem(causal_scale.QUICK, "fit_epochs", 2)
    records = causal_scale.run_causal_scale(out=tmp_path, quick=True)
    assert {r["sweep"] for r in records} == {"N", "M", "h", "fit"}
    assert "45 genes × 300 cells" in (tmp_path / "causal_scale.md").read_text()
    assert {r["method"] for r in records if r["sweep"] == "h"} == {"exact", "low_rank", "linearised_step",
                                                                    "linearise"}
    assert all(r["value"] > 0 for r in records)
    assert (tmp_path / "causal_scale.png").exists() and (tmp_path / "causal_scale.md").exists()


def test_dag_comparison_figure() -> None:
    from cape.pl import dag_comparison

    a = simulate_sem(6, 8, 20, seed=0)
    T = a.varp["true_dag"]
    fig = dag_comparison(T, T.T.toarray() * 0.5, labels=list(a.var_names), return_fig=True)
    assert len(fig.axes) >= 4
    with pytest.raises(ValueError):
        dag_comparison(np.zeros((2, 2)), np.zeros((3, 3)), return_fig=True)



def test_dag_comparison_of_a_genome_sized_graph_draws_only_genes_with_edges(monkeypatch, caplog) -> None:
    import importlib

    import scipy.sparse as sp

    module = importlib.import_module("cape.pl._dag_comparison")  # the module, not the function

    monkeypatch.setattr(module, "MAX_NODES", 30)
    n = 5000  # dense, the two adjacency images alone would be 400 MB
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 60, 80), rng.integers(0, 60, 80)
    keep = src < dst
    T = sp.csr_matrix((np.ones(keep.sum()), (src[keep], dst[keep])), shape=(n, n))
    with caplog.at_level("INFO", logger="cape"):
        fig = module.dag_comparison(T, T * 0.5, labels=[f"g{i}" for i in range(n)], return_fig=True)
    assert fig.axes[2].get_images()[0].get_array().shape == (30, 30)
    assert "drawing the 30 with an edge" in caplog.text


def test_benchmark_feeds_raw_and_standardized_inputs_from_a_seed_offset(tmp_path, monkeypatch) -> None:
    from cape._errors import CapeInputError

    monkeypatch.setitem(bench_causal.SETTINGS, "tiny", {"kind": "sem", "n_nodes": 4, "n_samples": 200})
    seen = []

    def empty_graph(method, X, seed, intervened=None):
        seen.append((seed, np.array(X)))
        return np.zeros((X.shape[1], X.shape[1])), 1.0

    monkeypatch.setattr(bench_causal, "_run_cape", empty_graph)
    records = bench_causal.run_causal_benchmark(out=tmp_path, settings=["tiny"], methods=["cape_dense"],
                                                n_seeds=2, seed_offset=3, inputs=["raw", "standardized"])
    assert {r["seed"] for r in records} == {3, 4}
    assert {r["input"] for r in records} == {"raw", "standardized"}
    assert [s for s, _ in seen] == [3, 3, 4, 4]
    raw, std = seen[0][1], seen[1][1]
    assert not np.allclose(raw.std(0), 1.0)  # the simulated variances differ: the cue standardising removes
    np.testing.assert_allclose(std, (raw - raw.mean(0)) / raw.std(0), atol=1e-10)
    text = (tmp_path / "causal.md").read_text()
    assert "| tiny | standardized | cape_dense |" in text and "median shd" in text
    with pytest.raises(CapeInputError):
        bench_causal.run_causal_benchmark(out=tmp_path, settings=["tiny"], methods=["cape_dense"], inputs=["zscore"])


_FAKE_SDCD = {
    "sdcd/__init__.py": "",
    "sdcd/utils/__init__.py": """
import os


def create_intervention_dataset(frame, perturbation_colname):
    labels = [str(x) for x in frame[perturbation_colname]]
    if os.environ.get("FAKE_SDCD_LABELS"):  # the test reads back what the child passed
        with open(os.environ["FAKE_SDCD_LABELS"], "w") as f:
            f.write("\\n".join(labels))
    else:
        assert set(labels) == {"obs"}
    return frame.drop(columns=perturbation_colname).to_numpy()
""",
    "sdcd/models/__init__.py": """
import numpy as np


class SDCD:
    def train(self, dataset):
        print("training on", dataset.shape)  # sdcd prints progress: must not reach the parent's result
        d = dataset.shape[1]
        self.weights = np.arange(d * d, dtype=float).reshape(d, d) / (d * d)

    def get_adjacency_matrix(self, threshold=True):
        return np.triu(self.weights > 0.5, 1).astype(int) if threshold else self.weights


DCDFG = SDCD
""",
}


def _fake_sdcd(root) -> None:
    for name, text in _FAKE_SDCD.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_sdcd_peer_runs_in_the_interpreter_named_by_the_environment(tmp_path, monkeypatch) -> None:
    import sys

    from cape_benchmarks.peers import SDCD_PYTHON_ENV

    _fake_sdcd(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv(SDCD_PYTHON_ENV, sys.executable)
    X = np.random.default_rng(0).normal(size=(50, 4))
    result = run_peer("sdcd", X, budget=120, seed=3)
    assert result.status == "ok", result.message
    weights = np.arange(16.0).reshape(4, 4) / 16
    expected = np.where(np.triu(weights > 0.5, 1), weights, 0.0)  # the thresholded DAG, weighted
    np.testing.assert_allclose(result.adjacency, expected)
    assert result.seconds >= 0


def test_sdcd_with_labels_gets_each_cells_perturbed_genes_and_sdcd_without_gets_none(tmp_path, monkeypatch) -> None:
    import sys

    from cape_benchmarks.peers import SDCD_PYTHON_ENV

    _fake_sdcd(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv(SDCD_PYTHON_ENV, sys.executable)
    X = np.random.default_rng(0).normal(size=(4, 5))
    intervened = np.zeros((4, 5), dtype=bool)
    intervened[1, 2] = intervened[2, [0, 3]] = True
    monkeypatch.setenv("FAKE_SDCD_LABELS", str(tmp_path / "labels.txt"))
    for mask in (intervened, sp.csr_matrix(intervened)):     # the count settings' masks are sparse
        assert run_peer("sdcd_labels", X, budget=120, intervened=mask).status == "ok"
        assert (tmp_path / "labels.txt").read_text().split("\n") == ["obs", "2", "0,3", "obs"]
    monkeypatch.delenv("FAKE_SDCD_LABELS")
    assert run_peer("sdcd", X, budget=120, intervened=intervened).status == "ok"   # asserts every label is "obs"
    with pytest.raises(ValueError, match="shape"):
        run_peer("sdcd_labels", X, budget=120, intervened=intervened[:, :3])


def test_sdcd_interpreter_given_as_a_relative_path_is_resolved_where_it_was_given(tmp_path, monkeypatch) -> None:
    from cape_benchmarks.peers import SDCD_PYTHON_ENV, sdcd_python

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(SDCD_PYTHON_ENV, "env/bin/python")
    assert sdcd_python() == str(tmp_path / "env" / "bin" / "python")
    monkeypatch.setenv(SDCD_PYTHON_ENV, "python3")  # a bare command stays for PATH lookup
    assert sdcd_python() == "python3"


def test_sdcd_peer_without_sdcd_says_how_to_install_it(tmp_path, monkeypatch) -> None:
    import importlib.util

    from cape_benchmarks.peers import SDCD_PYTHON_ENV

    if importlib.util.find_spec("sdcd") is not None:
        pytest.skip("sdcd is installed in this environment")
    monkeypatch.delenv(SDCD_PYTHON_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # no ./.venv-sdcd here
    result = run_peer("sdcd", np.zeros((10, 3)), budget=10)
    assert result.status == "error" and result.adjacency is None
    assert "make sdcd-env" in result.message and SDCD_PYTHON_ENV in result.message


def test_extra_thresholds_score_the_same_fit_and_every_graph_is_checked_for_cycles(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(bench_causal.SETTINGS, "tiny", {"kind": "sem", "n_nodes": 4, "n_samples": 200})
    weights = np.array([[0, 0.25, 0, 0], [0, 0, 0.15, 0], [0.05, 0, 0, 0], [0, 0, 0, 0]])  # a 3-cycle at τ 0.05
    monkeypatch.setattr(bench_causal, "_run_cape", lambda method, X, seed, intervened=None: (weights, 2.5))
    records = bench_causal.run_causal_benchmark(out=tmp_path, settings=["tiny"], methods=["cape"], n_seeds=1,
                                                taus=[0.05, 0.1, "auto"])
    methods = {r["method"] for r in records}
    assert methods == {"cape", "cape@τ0.05", "cape@τ0.1", "cape@τauto"}
    assert {r["value"] for r in records if r["metric"] == "seconds"} == {2.5}
    nnz = {r["method"]: r["value"] for r in records if r["metric"] == "nnz"}
    # τ 0.05's cycle is broken at its weakest edge; auto keeps τ 0.2, which gives half of the genes an edge
    assert nnz == {"cape": 1, "cape@τ0.1": 2, "cape@τ0.05": 2, "cape@τauto": 1}
    assert all(r["value"] == 1.0 for r in records if r["metric"] == "acyclic")
    assert "Returned graphs that are DAGs: 4 of 4" in (tmp_path / "causal.md").read_text()
    with pytest.raises(CapeInputError):
        bench_causal.run_causal_benchmark(out=tmp_path, settings=["tiny"], methods=["cape"], taus=[0.0])


def test_budget_thresholds_at_other_false_discovery_rates_cut_cape_and_the_undirected_peers_alike(
        tmp_path, monkeypatch) -> None:
    X = np.random.default_rng(0).normal(size=(400, 6))
    X[:, 1] += X[:, 0]
    X[:, 2] += 0.5 * X[:, 1]
    X[:, 3] += 0.15 * X[:, 2]                                # a weak edge: significant only at a looser FDR
    truth = np.zeros((6, 6))
    truth[0, 1] = truth[1, 2] = truth[2, 3] = 1.0
    monkeypatch.setitem(bench_causal.SETTINGS, "tiny_grn", {"kind": "grn", "cells": "control"})
    monkeypatch.setattr(bench_causal, "_grn_dataset", lambda *_: (X, truth, None))
    W = np.triu(np.abs(bench_causal.partial_correlations(X)), 1)
    monkeypatch.setattr(bench_causal, "_run_cape", lambda method, X, seed, intervened=None: (W, 1.0))
    records = bench_causal.run_causal_benchmark(out=tmp_path, settings=["tiny_grn"], n_seeds=1,
                                                methods=["cape_default", "partial_correlation"],
                                                taus=["budget", "budget0.5", 0.1, "fit-budget0.5",
                                                      "shrunk-budget0.5", "budget0.5:robust"])
    nnz = {r["method"]: r["value"] for r in records if r["metric"] == "nnz"}
    significant = {fdr: bench_causal.edge_budget(X, fdr) for fdr in (0.05, 0.2, 0.3, 0.5)}
    # a budget rule counts as Step I does: less the pairs called on the permuted copy (at 50 % FDR, one here), filled
    # towards one pair per gene from the pairs the fill's rate passes given the cell states too
    net = {fdr: significant[fdr] - decoy_count(X, fdr, seed=0) for fdr in significant}
    counts = {fdr: count_budget(X, None, fdr, BUDGET_FILL_FDR, seed=0).n_pairs for fdr in significant}
    assert all(net[fdr] <= counts[fdr] <= max(net[fdr], X.shape[1]) for fdr in significant)
    assert counts[0.3] < counts[0.5] < significant[0.5]
    assert nnz["cape_default"] == nnz["cape_default@τbudget"] == counts[bench_causal.BUDGET_FDR]
    assert nnz["cape_default@τbudget0.5"] == counts[0.5]
    assert nnz["cape_default@τfit-budget0.5"] == counts[0.5]  # the fit's ranking alone keeps as many here
    assert nnz["cape_default@τshrunk-budget0.5"] == counts[0.5]  # and so does the shrunk partial correlations'
    robust = bench_causal.edge_budget(X, 0.5, test="robust") - decoy_count(X, 0.5, "robust", seed=0)
    assert nnz["cape_default@τbudget0.5:robust"] == robust   # a budget counted by the test its suffix names
    assert nnz["partial_correlation@τbudget0.5:robust"] == 2 * robust
    assert nnz["partial_correlation"] == 2 * significant[0.05]  # the peer's own rule (plain BH), both directions
    assert nnz["partial_correlation@τbudget"] == 2 * counts[bench_causal.BUDGET_FDR]
    assert nnz["partial_correlation@τbudget0.5"] == 2 * counts[0.5]
    assert "partial_correlation@τ0.1" not in nnz            # a fixed τ means nothing for an undirected score
    assert bench_causal.parse_tau("fit-budget0.050") == "fit-budget0.05" and bench_causal.parse_tau("fit-budget")
    assert bench_causal._budget_fdr("fit-budget0.2") == 0.2 and bench_causal._budget_fdr("fit-budget") == 0.05
    assert bench_causal.parse_tau("shrunk-budget") == "shrunk-budget"
    assert bench_causal._budget_fdr("consensus-budget0.1") == 0.1
    assert bench_causal.parse_tau("shrunk-budget0.10:both") == "shrunk-budget0.1:both"
    assert bench_causal._budget_fdr("budget0.2:both") == 0.2 and bench_causal._budget_test("budget:robust") == "robust"
    assert bench_causal._budget_test("budget") == bench_causal.BUDGET_TEST
    for bad in ("budget1.5", "budgetx", "-1", "fit-0.1", "fit-budget2", "shrunk-0.1", "other-budget", "budget:x",
                "0.1:both", "auto:robust"):
        with pytest.raises(CapeInputError):
            bench_causal.parse_tau(bad)


def test_standardized_leaves_constant_columns_centred() -> None:
    X = np.column_stack([np.arange(5.0), np.full(5, 3.0)])
    Z = bench_causal.standardized(X)
    np.testing.assert_allclose(Z[:, 0].std(), 1.0)
    np.testing.assert_allclose(Z[:, 1], 0.0)


def _labelled_setting(monkeypatch, name: str, X: np.ndarray, perturbed: int, n_perturbed: int) -> np.ndarray:
    """A count-data setting ``name`` whose data are X, the truth 0 → 1 and the first cells perturbed on one gene."""
    truth = np.zeros((X.shape[1],) * 2)
    truth[0, 1] = 1.0
    mask = np.zeros(X.shape, dtype=bool)
    mask[:n_perturbed, perturbed] = True
    monkeypatch.setitem(bench_causal.SETTINGS, name, {"kind": "grn", "cells": "all"})
    monkeypatch.setattr(bench_causal, "_grn_dataset", lambda *_: (X, truth, mask))
    return mask


def test_count_data_settings_pass_the_knockout_labels_and_score_undirected_peers(tmp_path, monkeypatch) -> None:
    X = np.random.default_rng(0).normal(size=(60, 5))
    X[:, 1] += X[:, 0]
    mask = _labelled_setting(monkeypatch, "tiny_grn", X, perturbed=1, n_perturbed=20)
    seen = {}

    def fake(method, X, seed, intervened=None):
        options = dict(bench_causal.CAPE_METHODS[method])
        seen[method] = intervened if options.get("labels") else None
        W = np.zeros((5, 5))
        W[0, 1] = 0.5
        return W, 1.0

    monkeypatch.setattr(bench_causal, "_run_cape", fake)
    records = bench_causal.run_causal_benchmark(
        out=tmp_path, settings=["tiny_grn"], n_seeds=1,
        methods=["cape_default", "cape_default_nolabels", "partial_correlation", "graphical_lasso"])
    assert seen["cape_default"] is mask and seen["cape_default_nolabels"] is None
    value = {(r["method"], r["metric"]): r["value"] for r in records}
    assert value[("cape_default", "skeleton_f1")] == 1.0 and value[("cape_default", "f1")] == 1.0
    assert value[("partial_correlation", "skeleton_f1")] == 1.0  # the one strong pair, both directions
    assert value[("graphical_lasso", "nnz")] >= 1 and 0 < value[("partial_correlation", "auprc")] <= 1
    # cape ranks the true edge first of 20 ordered pairs: the early precision ratio is 1 / density = 20.
    assert value[("cape_default", "epr")] == pytest.approx(20.0)
    assert value[("cape_default", "f1_labels_ceiling")] == 1.0  # gene 1 is perturbed; the pair is already right
    text = (tmp_path / "causal.md").read_text()
    assert "skeleton_f1" in text and "median epr" in text


def test_oriented_by_truth_fixes_only_true_pairs_touching_the_perturbed_genes() -> None:
    T = np.zeros((4, 4))
    T[0, 1] = T[2, 3] = 1
    E = np.zeros((4, 4))
    E[1, 0] = E[3, 2] = E[0, 2] = 1  # both true pairs reversed, and one false edge
    fixed = bench_causal.oriented_by_truth(T, E, np.array([True, False, False, False]))
    assert fixed[0, 1] == 1 and fixed[1, 0] == 0  # touches gene 0: turned
    assert fixed[3, 2] == 1 and fixed[2, 3] == 0  # touches no perturbed gene: left reversed
    assert fixed[0, 2] == 1  # a false edge stays
    np.testing.assert_array_equal(bench_causal.oriented_by_truth(T, E, np.ones(4, bool)) != 0,
                                  (T != 0) | (E * (1 - (T + T.T)) != 0))


def test_skeleton_f1_ignores_direction() -> None:
    T = np.zeros((3, 3))
    T[0, 1] = T[1, 2] = 1
    E = np.zeros((3, 3))
    E[1, 0] = E[0, 2] = 1
    assert bench_causal.skeleton_f1(T, E) == 0.5 and bench_causal.skeleton_f1(T, T.T) == 1.0


@pytest.mark.parametrize("method", ["cape_paper", "cape_parents_mlp", "cape_default"])
def test_every_cape_variant_fits_a_ten_gene_graph(monkeypatch, method) -> None:
    """The paper's rank 40 falls back to a dense A below 41 genes; the parents MLP needs no rank."""
    monkeypatch.setitem(bench_causal.CAPE_METHODS, method,
                        {**bench_causal.CAPE_METHODS[method], **({"screen_steps": 5, "steps": 5}
                                                                 if method == "cape_parents_mlp" else {"epochs": 2})})
    X = np.random.default_rng(0).normal(size=(200, 10))
    weights, seconds = bench_causal._run_cape(method, X, seed=0)
    assert weights.shape == (10, 10) and np.isfinite(weights).all() and seconds >= 0


def test_bnlearn_settings_draw_new_cells_per_seed_with_knockdown_labels(tmp_path, monkeypatch) -> None:
    network = {"nodes": ["a", "b", "c"], "cpds": {
        "a": {"coefficients": {"(Intercept)": [0.0]}, "variance": [1.0], "parents": []},
        "b": {"coefficients": {"(Intercept)": [1.0], "a": [0.9]}, "variance": [0.5], "parents": ["a"]},
        "c": {"coefficients": {"(Intercept)": [0.0], "b": [-0.7]}, "variance": [0.5], "parents": ["b"]}}}
    path = tmp_path / "ecoli70.json"
    path.write_text(json.dumps(network))
    monkeypatch.setattr(bench_causal.data, "fetch", lambda name: {"network": path})
    X0, truth, mask = bench_causal._dataset("bn_ecoli70_knockdown", 0, 50)
    X1, _, _ = bench_causal._dataset("bn_ecoli70_knockdown", 1, 50)
    # 50 controls and 100 cells for each of the 3 genes (the 10 most reaching genes, capped at the genes there are).
    assert X0.shape == (350, 3) and truth[0, 1] == 0.9 and truth[1, 2] == -0.7
    assert mask.shape == (350, 3) and mask[:50].nnz == 0 and mask[50:].nnz == 300
    assert not np.allclose(X0, X1)
    X, _, none = bench_causal._dataset("bn_ecoli70", 0, 50)
    assert X.shape == (50, 3) and none is None


def test_a_failing_graphical_lasso_is_recorded_not_fatal(tmp_path, monkeypatch) -> None:
    X = np.random.default_rng(0).normal(size=(60, 4))
    monkeypatch.setitem(bench_causal.SETTINGS, "tiny_grn", {"kind": "grn", "cells": "control"})
    monkeypatch.setattr(bench_causal, "_grn_dataset", lambda *_: (X, np.eye(4, k=1), None))

    def ill_conditioned(method, X, seed):
        raise FloatingPointError("Non SPD result: the system is too ill-conditioned for this solver")

    monkeypatch.setattr(bench_causal, "_run_undirected", ill_conditioned)
    records = bench_causal.run_causal_benchmark(out=tmp_path, settings=["tiny_grn"], n_seeds=1,
                                                methods=["graphical_lasso"])
    assert {r["status"] for r in records} == {"failed"}
    assert "graphical_lasso: failed" in (tmp_path / "causal.md").read_text()


_FAKE_ARBORETO = {
    "arboreto/__init__.py": "",
    "arboreto/algo.py": """
import pandas as pd


def grnboost2(expression_data, client_or_address, seed, verbose):
    assert client_or_address.threads == 1 and seed == 3
    # gene 0 explains gene 1 best, then 1 explains 2; the reverse weakly
    return pd.DataFrame({"TF": ["0", "1", "1", "2"], "target": ["1", "2", "0", "1"],
                         "importance": [5.0, 3.0, 1.0, 0.5]})
""",
    "distributed/__init__.py": """
class LocalCluster:
    def __init__(self, n_workers, threads_per_worker, processes, dashboard_address):
        self.threads = threads_per_worker

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Client:
    def __init__(self, cluster):
        self.threads = cluster.threads

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
""",
}


def test_grnboost2_peer_returns_every_pairs_importance_from_its_own_interpreter(tmp_path, monkeypatch) -> None:
    import sys

    from cape_benchmarks.peers import GRNBOOST2_PYTHON_ENV

    for name, text in _FAKE_ARBORETO.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv(GRNBOOST2_PYTHON_ENV, sys.executable)
    result = run_peer("grnboost2", np.random.default_rng(0).normal(size=(30, 3)), budget=120, seed=3)
    assert result.status == "ok", result.message
    expected = np.zeros((3, 3))
    expected[0, 1], expected[1, 2], expected[1, 0], expected[2, 1] = 5.0, 3.0, 1.0, 0.5
    np.testing.assert_allclose(result.adjacency, expected)
    monkeypatch.delenv(GRNBOOST2_PYTHON_ENV)
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.chdir(tmp_path / "arboreto")  # no ./.venv-grnboost2 here
    import importlib.util

    if importlib.util.find_spec("arboreto") is None:
        missing = run_peer("grnboost2", np.zeros((10, 3)), budget=10)
        assert missing.status == "error" and "make grnboost2-env" in missing.message


def test_a_ranking_peer_is_cut_at_capes_budget_and_ranked_by_its_scores(tmp_path, monkeypatch) -> None:
    X = np.random.default_rng(0).normal(size=(400, 4))
    X[:, 1] += 2 * X[:, 0]
    truth = np.zeros((4, 4))
    truth[0, 1] = 1.0
    monkeypatch.setitem(bench_causal.SETTINGS, "tiny_grn", {"kind": "grn", "cells": "control"})
    monkeypatch.setattr(bench_causal, "_grn_dataset", lambda *_: (X, truth, None))
    scores = np.full((4, 4), 0.1)
    scores[0, 1], scores[1, 0] = 5.0, 2.0
    monkeypatch.setattr(bench_causal, "run_peer", lambda method, X, **kw: PeerResult(
        method, "ok", scores.copy(), 1.0))
    records = bench_causal.run_causal_benchmark(out=tmp_path, settings=["tiny_grn"], n_seeds=1, methods=["grnboost2"])
    value = {r["metric"]: r["value"] for r in records}
    assert value["nnz"] == bench_causal.edge_budget(X) == 1  # one significant pair: one directed edge, 0 → 1
    assert value["f1"] == 1.0 and value["auprc"] == 1.0


def test_cape_default_resolves_rank_as_causal_graph_does_beyond_the_dense_size(monkeypatch) -> None:
    # 12 genes stand in for a large gene set: dense only up to 8 genes without candidates, rank 3 above.
    import importlib

    config_module = importlib.import_module("cape.causal.causal_config")
    monkeypatch.setattr(config_module, "DENSE_MAX_GENES", 8)
    monkeypatch.setattr(config_module, "LOW_RANK", 3)
    seen = []
    monkeypatch.setattr(bench_causal, "fit_variational_notears",
                        lambda X, **kw: seen.append(kw) or type("Fit", (), {"adjacency": np.zeros((12, 12))})())
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 12))
    X[:, 1:6] += 2.0 * X[:, :5]
    bench_causal._run_cape("cape_default", X, 0)
    bench_causal._run_cape("cape_default_noscreen", X, 0)
    assert seen[0]["rank"] is None and seen[0]["candidates"][0, 1] and seen[0]["lambda_sparse"] == 0.3
    assert seen[1]["rank"] == 3 and "candidates" not in seen[1] and seen[1]["lambda_sparse"] == 1.0


def test_sachs_settings_label_every_cell_that_targets_a_measured_protein(monkeypatch) -> None:
    from test_bench_intervention import GENES, _fake_sachs

    monkeypatch.setattr(bench_causal.data, "load", lambda name: _fake_sachs(n=5))
    X_all, truth, mask_all = bench_causal._dataset("sachs_all_conditions", 0, None)
    X_some, _, mask_some = bench_causal._dataset("sachs_conditions", 0, None)
    assert X_all.shape == (45, 11) and truth.shape == (11, 11)  # 9 conditions × 5 cells, pma included
    assert X_some.shape == (40, 11)  # pma dropped: PKC is already g0076's target
    mask_all, mask_some = mask_all.toarray(), mask_some.toarray()
    pkc = GENES.index("PKC")
    assert mask_all[:, pkc].sum() == 10 and mask_some[:, pkc].sum() == 5  # g0076 and pma / g0076
    assert mask_all.sum(1).max() == 1 and mask_all.any(1).sum() == 35  # one target per perturbed cell; 10 controls


def test_cape_default_turns_edges_by_the_labels_and_leave_out_keeps_the_fit(tmp_path, monkeypatch) -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 3))
    X[:50, 0] = -3.0  # cells 0-49: gene 0 knocked out
    X[:, 1] += X[:, 0]
    _labelled_setting(monkeypatch, "tiny_ko", X, perturbed=0, n_perturbed=50)

    def reversed_fit(method, X, seed, intervened=None):
        W = np.zeros((3, 3))
        W[1, 0] = 0.5  # the fit got the pair backwards
        return W, 1.0

    monkeypatch.setattr(bench_causal, "_run_cape", reversed_fit)
    records = bench_causal.run_causal_benchmark(
        out=tmp_path, settings=["tiny_ko"], n_seeds=1,
        methods=["cape_default", "cape_default_leave_out", "cape_default_orient_only"])
    f1 = {r["method"]: r["value"] for r in records if r["metric"] == "f1"}
    assert f1["cape_default"] == f1["cape_default_orient_only"] == 1.0 and f1["cape_default_leave_out"] == 0.0


def test_grn_dataset_takes_the_cells_per_knockout(monkeypatch) -> None:
    small = dict(n_genes=60, n_edges=90, n_control=60, n_cell_types=3, n_programs=2, n_single=4, n_double=2,
                 n_cells_per_perturbation=5, seed=0)
    monkeypatch.setitem(bench_causal.GRN_SIMULATIONS, "quick", small)
    X, truth, mask = bench_causal._grn_dataset("all", 0)
    X12, _, mask12 = bench_causal._grn_dataset("all", 0, per_knockout=12)
    # Cells with fewer than 20 detected genes are dropped by the preprocessing, so count the knock-out cells left.
    knocked, knocked12 = (int((np.asarray(m.sum(axis=1)).ravel() > 0).sum()) for m in (mask, mask12))
    assert mask.shape == X.shape and truth.shape == (X.shape[1],) * 2
    assert 0 < knocked <= 6 * 5 < knocked12 <= 6 * 12
    assert X12.shape[0] - knocked12 == X.shape[0] - knocked
    assert bench_causal.SETTINGS["grn_knockout_300cells"]["per_knockout"] == 300


def test_confidence_scores_rank_a_regulation_above_a_shared_cell_type():
    import numpy as np

    from cape_benchmarks.causal import confidence_scores

    rng = np.random.default_rng(0)
    types = np.repeat([0, 1], 400)
    a, b = 3.0 * types + rng.normal(size=800), 3.0 * types + rng.normal(size=800)
    c = 0.6 * a + rng.normal(size=800)
    X = np.column_stack([a, b, c, 4.0 * types[:, None] + rng.normal(size=(800, 10))])
    truth, W = np.zeros((13, 13)), np.zeros((13, 13))
    truth[0, 2] = W[0, 2] = W[0, 1] = 1.0
    scores = confidence_scores(truth, W, X, None, seed=0)
    assert scores["kept_precision"] == 0.5
    assert scores["confidence_auprc"] == 1.0 and scores["confidence_gap_closed"] == 1.0
    assert scores["ordered_confidence_gap_closed"] == 1.0
    assert confidence_scores(truth, truth, X, None, seed=0) == {}  # every kept edge right: nothing to rank


def test_kept_edge_scores_break_the_confidences_ties_by_the_partial_correlation():
    import numpy as np

    from cape_benchmarks.causal import kept_edge_scores

    truth, dag = np.zeros((4, 4)), np.zeros((4, 4))
    truth[0, 1] = truth[2, 3] = 1.0
    dag[0, 1] = dag[1, 2] = dag[3, 2] = 1.0  # two right (0–1, 3–2 reversed), one wrong
    confidence = np.where(dag != 0, 1.0, 0.0)  # all tied: the confidence ranks like chance
    partial = np.zeros((4, 4))
    partial[0, 1], partial[3, 2], partial[1, 2] = 0.5, -0.4, 0.1
    scores = kept_edge_scores(truth, dag, confidence, partial)
    assert scores["kept_precision"] == np.float64(2 / 3) and scores["confidence_gap_closed"] == 0.0
    assert scores["ordered_confidence_auprc"] == 1.0 and scores["ordered_confidence_gap_closed"] == 1.0
    assert set(kept_edge_scores(truth, dag, confidence)) == {"kept_precision", "confidence_auprc",
                                                             "confidence_gap_closed"}
    assert kept_edge_scores(truth, np.zeros((4, 4)), confidence) == {}


def test_the_benchmarks_budget_graph_is_the_pipelines_likelihood_turns_included():
    counts, truth, _ = simulate_member(panel_settings()["grn_cells"], 0, 600, 30, 45)
    X, _ = log_normalised(counts, truth)
    X = X.astype(np.float32)
    graph = learn_causal_graph(X, np.array([f"g{i}" for i in range(X.shape[1])]), CausalConfig(epochs=5),
                               device="cpu", seed=0)
    assert graph.record["likelihood_orientation"]["n_edges_turned"] > 0  # the search changed this graph
    rebuilt = bench_causal._thresholded(graph.fit.adjacency, X.astype(np.float64), "budget", 0)
    np.testing.assert_array_equal(rebuilt != 0, graph.dag != 0)
