"""cape.pl.dag: what the figure shows (its legend names the colours) and bad input."""

from __future__ import annotations

import anndata as ad
import matplotlib
import numpy as np
import pytest
import scipy.sparse as sp

import cape
from cape import CapeInputError
from cape._io import save_figure
from cape.pl._graph import NODES_GID
from cape.pl._labels import LABEL_GID

matplotlib.use("Agg")


def test_dag_legend_names_the_edge_colours():
    adata = ad.AnnData(np.zeros((3, 4), dtype=np.float32))
    dag = np.zeros((4, 4))
    dag[0, 1], dag[1, 2] = 0.5, -0.3
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    fig = cape.pl.dag(adata, return_fig=True)
    legend = fig.axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["positive weight", "negative weight"]
    assert legend.get_title().get_text() == "edge width: |weight|"
    adata.varp["cape_dag"] = sp.csr_matrix((4, 4))
    with pytest.raises(CapeInputError, match="has no edges to draw"):
        cape.pl.dag(adata, return_fig=True)


def _hub_graph(n_genes: int = 60) -> ad.AnnData:
    """A hub driving eight genes, a chain of three, a pair, and genes without an edge."""
    adata = ad.AnnData(np.zeros((3, n_genes), dtype=np.float32))
    adata.var_names = [f"gene_with_a_long_name_{i}" for i in range(n_genes)]
    dag = np.zeros((n_genes, n_genes))
    dag[0, 1:9] = np.linspace(0.2, 0.9, 8) * np.array([1, -1] * 4)
    dag[10, 11], dag[11, 12], dag[20, 21] = 0.5, 0.4, -0.6
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    adata.var["cape_generality"] = np.linspace(1.0, 0.1, n_genes)  # gene 0 the most general
    return adata


def _drawn_labels(fig) -> list:
    return [t for t in fig.axes[0].texts if t.get_gid() == LABEL_GID]


def test_dag_draws_only_genes_with_an_edge_and_counts_the_others(tmp_path):
    adata = _hub_graph()
    fig = cape.pl.dag(adata, return_fig=True)
    nodes = next(c for c in fig.axes[0].collections if c.get_gid() == NODES_GID)
    assert len(nodes.get_offsets()) == 14  # 9 + 3 + 2 genes with an edge; the 46 others left out
    notes = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "46 of 60 genes have no edge" in notes
    path = save_figure(fig, tmp_path / "dag.png")
    assert path.stat().st_size > 0


def test_dag_labels_the_most_general_genes_without_overlap():
    fig = cape.pl.dag(_hub_graph(), n_labels=10, return_fig=True)
    labels = _drawn_labels(fig)
    assert labels and labels[0].get_text() == "gene_with_a_long_name_0"  # the hub
    assert len(labels) <= 10
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in labels]
    assert not any(a.overlaps(b) for k, a in enumerate(boxes) for b in boxes[k + 1:])


def test_dag_keeps_a_hub_with_its_targets_when_n_genes_is_small():
    fig = cape.pl.dag(_hub_graph(), n_genes=5, return_fig=True)
    nodes = next(c for c in fig.axes[0].collections if c.get_gid() == NODES_GID)
    assert len(nodes.get_offsets()) == 5
    assert "causal gene graph: 5 genes" in fig.axes[0].get_title()
    assert ", 4 of 11 edges" in fig.axes[0].get_title()  # the hub and four targets, each drawn with its edge


def test_dag_dashes_the_edges_below_solid_confidence():
    adata = _hub_graph()
    dag = adata.varp["cape_dag"].toarray()
    confidence = np.where(dag != 0, 1.0, 0.0)
    confidence[0, 1] = 0.5  # one guess
    adata.varp["cape_dag_confidence"] = sp.csr_matrix(confidence)
    fig = cape.pl.dag(adata, return_fig=True)
    arrows = [p for p in fig.axes[0].patches if hasattr(p, "get_linestyle")]
    dashed = [p for p in arrows if p.get_linestyle() not in ("-", "solid")]
    assert len(arrows) == int((dag != 0).sum()) and len(dashed) == 1
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[-1] == f"confidence < {cape.causal.SOLID_CONFIDENCE:g}"
    del adata.varp["cape_dag_confidence"]
    fig = cape.pl.dag(adata, return_fig=True)
    assert all(p.get_linestyle() in ("-", "solid") for p in fig.axes[0].patches)
