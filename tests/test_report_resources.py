from __future__ import annotations

import json

import pytest

from cape.report.findings import (
    resources_finding,
)
from cape.report.resources import (
    STAGES,
    own_resources,
    read_benchmark,
    resource_records,
    resources_from_records,
    resources_table,
    stage_resources,
)


# ------------------------------------------------------------------------------------------------- resources
def _bench(path, rows):
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    path.write_text(header + "".join("\t".join(map(str, r)) + "\n" for r in rows))


def test_benchmark_files_are_read_and_missing_ones_say_so(tmp_path):
    _bench(tmp_path / "preprocess.tsv", [(12.32, "0:00:12", 544.79, 1166.8, 521.4, 531.7, 580.1, 2.8, 84.4, 10.9)])
    _bench(tmp_path / "causal.tsv", [(10.0, "0:00:10", 600.0, 1, 1, 1, 1, 1, 1, 1),
                                     (20.0, "0:00:20", 900.0, 1, 1, 1, 1, 1, 1, 1)])  # --benchmark-repeats 2
    _bench(tmp_path / "embed.tsv", [(0.4, "0:00:00", "NA", "NA", "NA", "NA", "NA", "NA", "NA", "NA")])
    (tmp_path / "encode.tsv").write_text("")  # empty: not measured, no crash
    assert read_benchmark(tmp_path / "preprocess.tsv") == {"seconds": 12.32, "max_rss_mb": 544.79}
    assert read_benchmark(tmp_path / "causal.tsv") == {"seconds": 15.0, "max_rss_mb": 900.0}
    assert read_benchmark(tmp_path / "embed.tsv") == {"seconds": 0.4, "max_rss_mb": None}
    assert read_benchmark(tmp_path / "train.tsv") is None
    rows = stage_resources(tmp_path)
    assert [r["stage"] for r in rows] == list(STAGES)
    assert [r["source"] for r in rows] == ["Snakemake benchmark"] * 3 + ["not measured"] * 2
    _, table = resources_table(rows)
    assert table[1] == ["causal", "15.0 s", "900.0 MB", "Snakemake benchmark"]
    assert table[2][2] == "not measured" and table[4][1:3] == ["not measured", "not measured"]
    records = resource_records(rows, dataset="d", seed=0)
    assert {(r["method"], r["metric"]) for r in records} == {("preprocess", "seconds"), ("preprocess", "max_rss_mb"),
                                                            ("causal", "seconds"), ("causal", "max_rss_mb"),
                                                            ("embed", "seconds")}
    back = resources_from_records(records)
    assert back[2] == {"stage": "embed", "seconds": 0.4, "max_rss_mb": None, "source": "Snakemake benchmark"}
    finding = resources_finding(rows)
    assert "the longest stage causal (15 s)" in finding.text and "largest peak memory causal (900 MB)" in finding.text
    assert finding.text.endswith("Not measured: encode, train.")
    assert all(r["source"] == "not measured" for r in stage_resources(tmp_path / "nowhere"))


def test_own_resources_are_this_process():
    row = own_resources()
    assert row["stage"] == "evaluate" and "getrusage" in row["source"]
    assert 10 < row["max_rss_mb"] < 1e6


def test_cli_evaluate_reports_resources(trained_adata, tmp_path, capsys):
    from cape.cli import main

    trained_adata.write_h5ad(tmp_path / "trained_adata.h5ad")
    bench = tmp_path / "bench"
    bench.mkdir()
    _bench(bench / "train.tsv", [(91.8, "0:01:31", 738.66, 1, 1, 1, 1, 1, 1, 1)])
    args = ["evaluate", "--input", str(tmp_path / "trained_adata.h5ad"), "--label-key", "cell_type", "--name", "toy",
            "--metrics", str(tmp_path / "m.json"), "--report", str(tmp_path / "r.md")]
    assert main([*args, "--benchmarks", str(bench)]) == 0
    text = (tmp_path / "r.md").read_text()
    assert "| train | 91.8 s | 738.7 MB | Snakemake benchmark |" in text
    assert "| causal | not measured | not measured | not measured |" in text
    assert "| evaluate |" in text and "this process (resource.getrusage)" in text
    records = json.loads((tmp_path / "m.json").read_text())
    res = {(r["method"], r["metric"]): r["value"] for r in records if r["task"] == "resources"}
    assert res[("train", "max_rss_mb")] == pytest.approx(738.66) and res[("evaluate", "max_rss_mb")] > 10
    assert ("causal", "seconds") not in res
    assert main([*args, "--benchmarks", str(tmp_path / "missing")]) == 2
    assert "--benchmarks" in capsys.readouterr().err
