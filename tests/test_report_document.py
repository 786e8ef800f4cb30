from __future__ import annotations

import json

from cape.report import evaluate_run, write_report


def test_report_has_figures_and_metrics(trained_adata, tmp_path):
    records = evaluate_run(trained_adata, "cell_type", dataset="toy")
    out = write_report(trained_adata, records, tmp_path / "report.md", label_key="cell_type")
    text = out.read_text()
    for fig in ("dag.png", "poincare.png", "cells.png"):
        assert (tmp_path / "report_figures" / fig).stat().st_size > 1000
        assert f"report_figures/{fig}" in text
    assert "### annotation" in text and "logreg_pca" in text
    json.dumps(records)
