"""Peer subprocess runner, the causal benchmarks' outputs (tiny settings) and pl.dag_comparison."""

from __future__ import annotations

import json

import matplotlib
import numpy as np
import pytest
import torch

from cape.bench import causal as bench_causal
from cape.bench import causal_scale
from cape.bench.peers import run_peer
from cape.data.simulate import simulate_sem

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
    assert {r["metric"] for r in records} == {"seconds", *bench_causal.METRICS}
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
    records = causal_scale.run_causal_scale(out=tmp_path, quick=True)
    assert {r["sweep"] for r in records} == {"N", "M", "h"}
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

    module = importlib.import_module("cape.pl.dag_comparison")  # the module, not the function

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

    def empty_graph(method, X, seed):
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


def test_standardized_leaves_constant_columns_centred() -> None:
    X = np.column_stack([np.arange(5.0), np.full(5, 3.0)])
    Z = bench_causal.standardized(X)
    np.testing.assert_allclose(Z[:, 0].std(), 1.0)
    np.testing.assert_allclose(Z[:, 1], 0.0)
