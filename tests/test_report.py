from __future__ import annotations

import json

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from cape import CapeInputError
from cape.report import SPLIT_KEY, evaluate_run, resolve_label_key, write_report


@pytest.fixture
def trained() -> ad.AnnData:
    """A run's AnnData as `cape train` leaves it: two separable cell types, an embedding, predictions, a split."""
    rng = np.random.default_rng(0)
    n, m = 120, 12
    labels = np.repeat(["T", "B"], n // 2)
    x = rng.poisson(2.0, size=(n, m)).astype(np.float32)
    x[labels == "B", :4] += 6
    adata = ad.AnnData(np.log1p(x))
    adata.obs_names = [f"c{i}" for i in range(n)]
    adata.var_names = [f"g{i}" for i in range(m)]
    adata.obs["cell_type"] = pd.Categorical(labels)
    adata.obsm["X_cape"] = np.c_[(labels == "B") * 3.0, np.zeros(n)] + rng.normal(0, 0.3, (n, 2))
    pred = labels.copy()
    pred[:6] = "B"  # 6 mistakes among the T cells
    adata.obs["cape_cell_type_prediction"] = pd.Categorical(pred)
    adata.obs[SPLIT_KEY] = np.where(np.arange(n) % 10 < 3, "fine_tune", "test")
    dag = np.zeros((m, m))
    dag[0, 1], dag[1, 2], dag[0, 3] = 0.8, -0.5, 0.3
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    adata.varm["cape_poincare"] = rng.uniform(-0.5, 0.5, size=(m, 2))
    adata.var["cape_generality"] = rng.uniform(size=m)
    adata.uns["cape"] = {"causal_graph": {"removed_cycle_edges": 1, "wall_time": 1.5}}
    return adata


def _value(records, task, method, metric):
    (v,) = [r["value"] for r in records if (r["task"], r["method"], r["metric"]) == (task, method, metric)]
    return v


def test_evaluate_run_scores_test_cells_only(trained):
    records = evaluate_run(trained, "cell_type", dataset="toy")
    test = trained.obs[SPLIT_KEY] == "test"
    truth = trained.obs["cell_type"][test].astype(str)
    pred = trained.obs["cape_cell_type_prediction"][test].astype(str)
    assert _value(records, "annotation", "cape", "accuracy") == pytest.approx((truth == pred).mean())
    assert _value(records, "annotation", "logreg_pca", "accuracy") > 0.9
    assert _value(records, "clustering", "cape", "ARI") > 0.9
    assert _value(records, "graph", "cape", "edges") == 3
    assert _value(records, "graph", "cape", "edges_removed_for_acyclicity") == 1
    assert {r["method"] for r in records if r["task"] == "clustering"} == {"cape", "pca_kmeans"}


def test_report_has_figures_and_metrics(trained, tmp_path):
    records = evaluate_run(trained, "cell_type", dataset="toy")
    out = write_report(trained, records, tmp_path / "report.md", label_key="cell_type")
    text = out.read_text()
    for fig in ("dag.png", "poincare.png", "cells.png"):
        assert (tmp_path / "report_figures" / fig).stat().st_size > 1000
        assert f"report_figures/{fig}" in text
    assert "### annotation" in text and "logreg_pca" in text
    json.dumps(records)


def test_label_key_resolution(trained):
    assert resolve_label_key(trained, "auto") is None
    trained.uns["cape"]["dataset"] = {"keys": {"labels": "cell_type"}}
    assert resolve_label_key(trained, "auto") == "cell_type"
    with pytest.raises(CapeInputError, match="label key obs\\['celltype'\\] not found"):
        resolve_label_key(trained, "celltype")


def test_single_class_is_refused(trained):
    trained.obs["one"] = "T"
    with pytest.raises(CapeInputError, match="at least 2"):
        evaluate_run(trained, "one")
