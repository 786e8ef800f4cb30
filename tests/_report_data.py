"""Record lookup shared by the report tests."""

from __future__ import annotations


def _value(records, task, method, metric):
    (v,) = [r["value"] for r in records if (r["task"], r["method"], r["metric"]) == (task, method, metric)]
    return v
