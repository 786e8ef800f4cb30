"""cape.pl.dag: what the figure shows (its legend names the colours) and bad input."""

from __future__ import annotations

import anndata as ad
import matplotlib
import numpy as np
import pytest
import scipy.sparse as sp

import cape
from cape import CapeInputError

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
