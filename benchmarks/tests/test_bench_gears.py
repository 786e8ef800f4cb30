"""``cape-bench gears`` (cape_benchmarks.gears): the command writes records, a table and a plot; graph choices.
Needs the optional 'gears' extra."""

from __future__ import annotations

import importlib.util
import json

import pytest

from cape import CapeInputError
from cape.tasks.gears_inputs import dag_gene2go, go_edge_list
from cape_benchmarks.cli import main
from cape_benchmarks.gears import resolve_go_graph

# Looked up, not imported: importing GEARS compiles dcor's numba code, which belongs in a test rather than in the
# collection, where a crash loses the pytest worker before any test has run.
pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(name) is None for name in ("gears", "torch_geometric")),
                                reason="needs the optional 'gears' extra (cell-gears, torch_geometric)")


@pytest.mark.slow  # an end-to-end benchmark run (records, table, plot): `pytest -m slow`
def test_bench_cli_writes_records(tiny_perturbation, tmp_path):
    path = tmp_path / "tiny.h5ad"
    tiny_perturbation.write_h5ad(path)
    code = main(["--quiet", "gears", "--dataset", str(path), "--arms", "plain", "pca", "--seeds", "0",
                 "--epochs", "1", "--go-graph", "known", "--out", str(tmp_path / "out")])
    assert code == 0
    records = json.loads((tmp_path / "out" / "gears_tiny.json").read_text())
    arms = {r["arm"] for r in records if r["kind"] == "gears"}
    assert arms == {"plain", "pca"}
    assert {r["arm"] for r in records if r["kind"] == "baseline"} == {"no_change", "train_mean", "additive", "linear"}
    assert "GEARS + pca" in (tmp_path / "out" / "gears_tiny.md").read_text()
    assert (tmp_path / "out" / "gears_tiny.png").stat().st_size > 0
    assert main(["--quiet", "gears", "--dataset", str(path), "--go-graph", "nope.txt",
                 "--out", str(tmp_path / "o2")]) == 2


def test_bench_go_graph_choices(tiny_perturbation):
    graph, note = resolve_go_graph("known", tiny_perturbation)
    assert (graph != tiny_perturbation.varp["true_dag"]).nnz == 0 and "true_dag" in note
    empty, _ = resolve_go_graph("empty", tiny_perturbation)
    assert empty.shape == (tiny_perturbation.n_vars, tiny_perturbation.n_vars) and empty.nnz == 0
    edges = go_edge_list(dag_gene2go(empty, list(tiny_perturbation.var_names)))
    assert edges["importance"].eq(1.0).all()  # self-loops only
    with pytest.raises(CapeInputError, match="cape_dag"):
        resolve_go_graph("cape_dag", tiny_perturbation, None)
    with pytest.raises(CapeInputError, match="known, cape_dag, empty"):
        resolve_go_graph("graph.txt", tiny_perturbation)
