"""``save=`` of every cape.pl function: the file is written in the suffix's format, the figure it made is closed, a
figure drawn into the caller's Axes stays open, and a bad name is refused before anything is drawn or written."""

from __future__ import annotations

import inspect

import anndata as ad
import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import cape
from cape import CapeInputError
from cape.pl._figure import checked_save_path

matplotlib.use("Agg")

MAGIC = {".png": b"\x89PNG", ".pdf": b"%PDF", ".svg": b"<?xml"}


def _embedded(n_genes: int = 30) -> ad.AnnData:
    """A small Step I–II result: a hub with five children, positions near the rim, generality, a predicted shift."""
    rng = np.random.default_rng(0)
    adata = ad.AnnData(np.zeros((3, n_genes), dtype=np.float32))
    adata.var_names = [f"G{i}" for i in range(n_genes)]
    e = rng.standard_normal((n_genes, 4))
    adata.varm["cape_poincare"] = e * (rng.uniform(0.8, 0.95, n_genes) / np.linalg.norm(e, axis=1))[:, None]
    adata.var["cape_generality"] = rng.pareto(1.5, n_genes) + 1e-3
    dag = np.zeros((n_genes, n_genes))
    dag[0, 1:6] = [0.5, -0.4, 0.3, 0.6, -0.2]
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    adata.uns["cape_intervention"] = {"intervention": {"G0": 0.0}}
    adata.var["cape_intervention_shift"] = np.r_[0.0, -dag[0, 1:6], np.zeros(n_genes - 6)]
    return adata


def _plots(adata: ad.AnnData) -> dict:
    """Each public plot as a call taking the plot's keywords."""
    genes = list(adata.var_names[:5])
    control = pd.Series(np.ones(5), index=genes)
    observed = pd.DataFrame([control + 0.5], index=["G1+ctrl"])
    predicted = pd.DataFrame([control + 0.4], index=["G1+ctrl"])
    dag = adata.varp["cape_dag"].toarray()
    return {
        "dag": lambda **kw: cape.pl.dag(adata, **kw),
        "dag_comparison": lambda **kw: cape.pl.dag_comparison(dag[:8, :8], dag[:8, :8], **kw),
        "generality": lambda **kw: cape.pl.generality(adata, **kw),
        "intervention": lambda **kw: cape.pl.intervention(adata, **kw),
        "perturbation_shifts": lambda **kw: cape.pl.perturbation_shifts(predicted, observed, control,
                                                                          {"G1+ctrl": genes}, **kw),
        "poincare": lambda **kw: cape.pl.poincare(adata, **kw),
    }


def test_every_plot_takes_save():
    assert set(_plots(_embedded())) == set(cape.pl.__all__)
    for name in cape.pl.__all__:
        assert "save" in inspect.signature(getattr(cape.pl, name)).parameters, name


@pytest.mark.parametrize("name", sorted(cape.pl.__all__))
def test_save_writes_the_file_and_closes_the_figure_it_made(name, tmp_path):
    plt.close("all")
    suffix = {"dag": ".pdf", "poincare": ".svg"}.get(name, ".png")
    target = tmp_path / "new" / "folder" / f"{name}{suffix}"
    assert _plots(_embedded())[name](save=target) is None
    assert target.read_bytes().startswith(MAGIC[suffix])
    assert plt.get_fignums() == []  # not shown, not returned: closed
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary file left


def test_save_with_return_fig_or_the_callers_axes_keeps_the_figure(tmp_path):
    plt.close("all")
    adata = _embedded()
    fig = cape.pl.dag(adata, save=tmp_path / "dag.png", return_fig=True)
    assert fig is not None and plt.fignum_exists(fig.number)
    own, ax = plt.subplots()
    assert cape.pl.generality(adata, ax=ax, save=tmp_path / "generality.png") is None
    assert plt.fignum_exists(own.number)  # the caller's figure is the caller's to close
    assert (tmp_path / "generality.png").stat().st_size > 0
    plt.close("all")


@pytest.mark.parametrize("save", ["dag", "dag.docx", 3, True])
def test_a_name_without_a_known_format_is_refused_before_drawing(save, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plt.close("all")
    with pytest.raises(CapeInputError, match="save must be a file path|cannot save a plot as"):
        cape.pl.dag(_embedded(), save=save)
    assert plt.get_fignums() == [] and list(tmp_path.iterdir()) == []


def test_checked_save_path_reads_the_suffix_case_blind():
    assert checked_save_path(None) is None
    assert checked_save_path("out/Graph.PNG").name == "Graph.PNG"
    with pytest.raises(CapeInputError, match=r"'graph\.txt'.*\.png"):
        checked_save_path("graph.txt")
