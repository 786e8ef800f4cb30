"""``cape-bench attention`` machinery on a tiny shape (no timing assertions)."""

from __future__ import annotations

import json

import pytest
import torch

from cape import CapeInputError
from cape_benchmarks import attention
from cape_benchmarks.cli import main


def test_attention_benchmark_records_and_report(tmp_path):
    shape = attention.AttentionShape(batch=1, genes=24, d_model=32, n_heads=2, position_dim=8)
    records = attention.run(["none", "cape", "hope"], repeats=1, device="cpu", shape=shape)
    metrics = {(r["encoding"], r["metric"]) for r in records}
    for name in ("sdpa", "none", "cape", "hope"):
        assert {(name, "time_ms"), (name, "peak_mib"), (name, "ratio_vs_sdpa")} <= metrics
    estimated = {r["encoding"] for r in records if r["metric"] == "estimated_ratio_vs_sdpa"}
    assert estimated == {"none", "cape"}  # hope's explicit attention is not hook-only work
    check = [r for r in records if r["metric"] == "genes_x_genes_in_encoding"]
    assert [(r["encoding"], r["value"]) for r in check] == [("cape", 0.0)]
    peak = {r["encoding"]: r["value"] for r in records if r["metric"] == "peak_mib"}
    assert peak["hope"] > peak["cape"] > 0  # explicit genes×genes logits cost memory; the tracker sees them
    paths = attention.write_report(records, tmp_path)
    assert json.loads(paths["json"].read_text())[0]["benchmark"] == "attention"
    assert "| cape |" in paths["md"].read_text() and paths["png"].stat().st_size > 0


def test_live_tensor_memory_tracker_counts_frees():
    with attention._LiveTensorMemory(genes=50) as tracker:
        a = torch.ones(1000, 250)  # 1 MB
        del a
        b = torch.ones(50, 50)
    assert abs(tracker.peak - 1_000_000) < 20_000 and tracker.square_shapes == [(50, 50)]
    del b


def test_cli_rejects_unknown_encoding(capsys):
    assert main(["attention", "--quick", "--encodings", "cape,nope", "--out", "/tmp/x"]) == 2
    assert "available: none" in capsys.readouterr().err
    with pytest.raises(CapeInputError):
        attention.run(["nope"], repeats=1, device="cpu")
