"""The end of a workflow run: the records of a trained model against same-run baselines (:mod:`.metrics`), the
verdict (:mod:`.verdict`, with :mod:`.statistics` and :mod:`.resources`) and the report document
(:mod:`.document`)."""

from __future__ import annotations

from .document import FIGURES, figures_dir, read_metrics, write_figures, write_metrics, write_report
from .findings import Finding, headline, verdict
from .metrics import attention_records, evaluate_run

__all__ = [
    "FIGURES",
    "Finding",
    "attention_records",
    "evaluate_run",
    "figures_dir",
    "headline",
    "read_metrics",
    "verdict",
    "write_figures",
    "write_metrics",
    "write_report",
]
