"""cape.pl.poincare: the disk's radii are the true norms, whatever the dimension; labels do not overlap."""

from __future__ import annotations

import anndata as ad
import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
import scipy.sparse as sp

import cape
from cape import CapeInputError
from cape._io import save_figure
from cape.pl._labels import LABEL_GID
from cape.pl._poincare_disk import POINTS_GID

matplotlib.use("Agg")


def _embedded(n_genes: int = 120, dim: int = 8, seed: int = 0) -> ad.AnnData:
    """Genes near the rim (norms 0.86–0.99, as Step II leaves them), a few hub edges, heavy-tailed generality."""
    rng = np.random.default_rng(seed)
    adata = ad.AnnData(np.zeros((3, n_genes), dtype=np.float32))
    adata.var_names = [f"G{i}" for i in range(n_genes)]
    e = rng.standard_normal((n_genes, dim))
    e *= (rng.uniform(0.86, 0.99, n_genes) / np.linalg.norm(e, axis=1))[:, None]
    adata.varm["cape_poincare"] = e
    adata.var["cape_generality"] = rng.pareto(1.5, n_genes) + 1e-3
    adata.var["cape_embedded"] = np.arange(n_genes) != n_genes - 1  # the last one sits at the origin
    adata.varm["cape_poincare"][n_genes - 1] = 0.0
    dag = np.zeros((n_genes, n_genes))
    dag[0, 1:6] = 0.5
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    return adata


def _points(fig) -> np.ndarray:
    return next(c for c in fig.axes[0].collections if c.get_gid() == POINTS_GID).get_offsets()


@pytest.mark.parametrize("dim", [2, 3, 16])
def test_poincare_radius_is_each_genes_true_norm(dim):
    adata = _embedded(dim=dim)
    fig = cape.pl.poincare(adata, return_fig=True)
    xy = np.asarray(_points(fig))
    norms = np.linalg.norm(adata.varm["cape_poincare"], axis=1)[adata.var["cape_embedded"].to_numpy()]
    assert len(xy) == adata.n_vars - 1  # the gene at the origin is not drawn
    np.testing.assert_allclose(np.sort(np.hypot(xy[:, 0], xy[:, 1])), np.sort(norms), rtol=1e-9)
    assert "true norm" in fig.axes[0].get_xlabel()
    plt.close(fig)


def test_poincare_in_two_dimensions_is_the_embedding_itself():
    adata = _embedded(dim=2)
    fig = cape.pl.poincare(adata, color=None, return_fig=True)
    xy = np.asarray(_points(fig))
    np.testing.assert_allclose(xy, adata.varm["cape_poincare"][:-1], atol=1e-12)
    plt.close(fig)


def test_poincare_distance_radius_spreads_the_rim_and_says_so():
    adata = _embedded()
    fig = cape.pl.poincare(adata, radius="distance", return_fig=True)
    r = np.hypot(*np.asarray(_points(fig)).T)
    distance = 2 * np.arctanh(np.linalg.norm(adata.varm["cape_poincare"][:-1], axis=1))
    np.testing.assert_allclose(np.sort(r), np.sort(distance / distance.max()), rtol=1e-9)
    assert "hyperbolic distance" in fig.axes[0].get_xlabel()
    plt.close(fig)
    with pytest.raises(CapeInputError, match="radius must be 'norm' or 'distance'"):
        cape.pl.poincare(adata, radius="log")


def test_poincare_labels_the_most_general_genes_without_overlap_and_writes_its_file(tmp_path):
    adata = _embedded()
    fig = cape.pl.poincare(adata, labels=8, return_fig=True)
    labels = [t for t in fig.axes[0].texts if t.get_gid() == LABEL_GID]
    most_general = adata.var_names[np.argsort(-adata.var["cape_generality"].to_numpy())[0]]
    assert labels and labels[0].get_text() == most_general and len(labels) <= 8
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in labels]
    assert not any(a.overlaps(b) for k, a in enumerate(boxes) for b in boxes[k + 1:])
    assert fig.axes[1].get_ylabel() == "generality π (PageRank)"  # the colourbar
    assert save_figure(fig, tmp_path / "poincare.png").stat().st_size > 0
    plt.close(fig)
