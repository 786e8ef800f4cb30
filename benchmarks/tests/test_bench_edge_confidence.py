"""cape-bench edge-confidence on its quick design: files, records and the simulation's shape."""

from __future__ import annotations

import json

import numpy as np

from cape_benchmarks.edge_confidence import METRICS, run_edge_confidence, simulate_mixture_counts


def test_the_simulation_is_seeded_and_its_truth_a_dag_over_the_kept_genes():
    X, truth = simulate_mixture_counts(0, n_cells=200, n_genes=20, n_edges=25, n_types=3)
    again, _ = simulate_mixture_counts(0, n_cells=200, n_genes=20, n_edges=25, n_types=3)
    np.testing.assert_array_equal(X, again)
    assert X.shape[1] == truth.shape[0] == truth.shape[1] and np.all(X >= 0)
    assert np.count_nonzero(np.triu(truth != 0) & np.triu(truth.T != 0)) == 0  # no 2-cycle


def test_quick_run_writes_its_table_and_records(tmp_path):
    records = run_edge_confidence(tmp_path, quick=True, types=(1, 3))
    assert {r["n_types"] for r in records} == {1, 3}
    assert {"kept", "kept_precision", "solid"} <= {r["metric"] for r in records}
    assert all(0 <= r["value"] <= 1 for r in records if r["metric"].endswith("precision") and r["value"] == r["value"])
    text = (tmp_path / "edge_confidence.md").read_text()
    assert "| cell types |" in text and all(m in text for m in METRICS)
    stored = json.loads((tmp_path / "edge_confidence.json").read_text())
    assert [(r["n_types"], r["metric"]) for r in stored] == [(r["n_types"], r["metric"]) for r in records]
    assert (tmp_path / "edge_confidence.png").stat().st_size > 1000
