from __future__ import annotations

import pytest
import scipy.sparse as sp
from _report_data import _value

from cape import CapeInputError
from cape.report import evaluate_run
from cape.report.document import _metrics_table
from cape.tasks.labels import SPLIT_KEY


def test_evaluate_run_scores_test_cells_only(trained_adata):
    records = evaluate_run(trained_adata, "cell_type", dataset="toy")
    test = trained_adata.obs[SPLIT_KEY] == "test"
    truth = trained_adata.obs["cell_type"][test].astype(str)
    pred = trained_adata.obs["cape_cell_type_prediction"][test].astype(str)
    assert _value(records, "annotation", "cape", "accuracy") == pytest.approx((truth == pred).mean())
    assert _value(records, "annotation", "logreg_pca", "accuracy") > 0.9
    assert _value(records, "clustering", "cape", "ARI") > 0.9
    assert _value(records, "graph", "cape", "edges") == 3
    assert _value(records, "graph", "cape", "edges_removed_for_acyclicity") == 1
    assert _value(records, "graph", "cape", "edges_turned_for_acyclicity") == 2
    assert {r["method"] for r in records if r["task"] == "clustering"} == {"cape", "pca_kmeans"}
    # the report's graph table says what each of its columns counts
    graph = _metrics_table(records).split("### graph\n\n")[1]
    assert graph.startswith("Step I's graph: `edges` kept; `edges_removed_for_acyclicity`, edges above the threshold")


def test_single_class_is_refused(trained_adata):
    trained_adata.obs["one"] = "T"
    with pytest.raises(CapeInputError, match="at least 2"):
        evaluate_run(trained_adata, "one")


def test_evaluate_keeps_a_sparse_matrix_sparse_for_the_pca_baseline(trained_adata, monkeypatch):
    """A 10x-shaped X must reach the PCA baseline sparse (densifying 5,000 × 33,000 cost 2.5 GB in evaluate)."""
    from cape.tasks import clustering

    trained_adata.X = sp.csr_matrix(trained_adata.X)
    seen = []
    original = clustering.BASELINES["pca_kmeans"]

    def spy(x, batches, seed, n_comps):
        seen.append(sp.issparse(x))
        return original[0](x, batches, seed, n_comps)

    monkeypatch.setitem(clustering.BASELINES, "pca_kmeans", (spy, *original[1:]))
    records = evaluate_run(trained_adata, "cell_type", dataset="toy", seed=0)
    assert seen == [True]
    assert any(r["method"] == "pca_kmeans" and r["metric"] == "ARI" for r in records)
