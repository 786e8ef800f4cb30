"""cape_benchmarks.embedding: the hierarchy section's sparse hub graphs and its records."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np

from cape.hyperbolic import embed_dag
from cape_benchmarks.embedding import HIERARCHY_VARIANTS, hierarchy_metrics, run_benchmark, sparse_hub_dag


def test_sparse_hub_dag_has_its_hubs_and_mostly_genes_without_an_edge():
    dag = sparse_hub_dag(300, seed=3)
    assert dag.shape == (300, 300) and dag.nnz == 55
    assert nx.is_directed_acyclic_graph(nx.from_scipy_sparse_array(dag, create_using=nx.DiGraph))
    out_degree = np.sort(np.asarray((dag != 0).sum(axis=1)).ravel())[::-1]
    assert list(out_degree[:3]) >= [10, 5, 5]
    has_edge = np.asarray((dag != 0).sum(axis=0)).ravel() + np.asarray((dag != 0).sum(axis=1)).ravel() > 0
    assert has_edge.sum() <= 83 and (~has_edge).sum() >= 217
    assert (sparse_hub_dag(300, seed=3) != dag).nnz == 0 and (sparse_hub_dag(300, seed=4) != dag).nnz > 0


def test_hierarchy_metrics_rank_the_most_general_gene_among_those_with_an_edge():
    result = embed_dag(sparse_hub_dag(60, seed=0), dim=4, epochs=0, init_scale=0.1, seed=0, show_progress=False)
    metrics = hierarchy_metrics(result)
    assert metrics["n_with_edge"] == int(result.connected.sum())
    norms = np.linalg.norm(result.poincare, axis=1)
    hub = np.argmax(result.generality)
    assert metrics["hub_norm"] == norms[hub]
    assert metrics["hub_rank"] == np.mean(norms[result.connected] < norms[hub])


def test_quick_hierarchy_section_writes_every_variant(tmp_path):
    records = run_benchmark(tmp_path, quick=True, sections=("hierarchy",))
    assert {r["variant"] for r in records} == set(HIERARCHY_VARIANTS)
    assert {r["metric"] for r in records} >= {"spearman_all", "spearman_with_edge", "hub_rank"}
    assert len(json.loads((tmp_path / "embedding_hierarchy.json").read_text())) == len(records)
    assert "lambda_g=0.1·M" in (tmp_path / "embedding_hierarchy.md").read_text()
