"""cape-bench throughput on a tiny design, on the CPU: every stage writes its record, the table and the JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cape._errors import CapeInputError
from cape_benchmarks import throughput


def test_every_stage_runs_and_is_recorded(tmp_path, monkeypatch):
    tiny = dict(n_genes=30, n_edges=40, n_control=240, n_cell_types=2, n_programs=2, n_single=2, n_double=0,
                n_cells_per_perturbation=10, seed=0)
    monkeypatch.setitem(throughput.GRN_SIMULATIONS, "quick", tiny)
    records = throughput.run_throughput(tmp_path, devices=["cpu"], quick=True, pretrain_cells=64)
    stages = [r["stage"] for r in records]
    assert stages == ["step1", "step2"] + ["pretrain"] * throughput.EPOCHS + ["finetune"] * throughput.EPOCHS
    step1 = records[0]
    assert step1["edges"] > 0 and 0 <= step1["directed_f1"] <= 1 and 0 <= step1["skeleton_f1"] <= 1
    assert all(r["cells_per_s"] > 0 and r["cells"] == 64 for r in records[2:])
    saved = json.loads((tmp_path / "throughput.json").read_text())
    assert saved["data"]["genes"] <= 30 and len(saved["records"]) == len(records)
    assert (tmp_path / "throughput.md").read_text().count("| cpu |") == len(records)


def test_the_transcriptome_design_runs_step1_and_step2_only(tmp_path, monkeypatch):
    tiny = dict(n_genes=30, n_edges=40, n_control=200, n_cell_types=2, n_programs=2, n_single=0, n_double=0,
                n_cells_per_perturbation=30, seed=0)
    monkeypatch.setitem(throughput.GRN_SIMULATIONS, "transcriptome", tiny)
    records = throughput.run_throughput(tmp_path, devices=["cpu"], design="transcriptome")
    assert [r["stage"] for r in records] == ["step1", "step2"]
    assert records[0]["gpu_peak_gb"] is None and records[0]["edges"] > 0
    assert json.loads((tmp_path / "throughput.json").read_text())["data"]["design"] == "transcriptome"


def test_the_transcriptome_design_wants_cuda_or_a_named_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CapeInputError, match="--devices cpu"):
        throughput.throughput_devices("transcriptome", None)
    assert throughput.throughput_devices("transcriptome", ["cpu"]) == ["cpu"]
    assert throughput.throughput_devices("scale", None) == ["cpu"]
    # a named CUDA device that is not there, or a name that is no device, is refused before any data are made
    for design in ("scale", "transcriptome"):
        with pytest.raises(CapeInputError, match="CUDA is not available on this machine"):
            throughput.throughput_devices(design, ["cpu", "cuda"])
    with pytest.raises(CapeInputError, match="unknown device 'gpu'"):
        throughput.throughput_devices("scale", ["gpu"])
    with pytest.raises(CapeInputError, match="design must be one of"):
        throughput.run_throughput(devices=["cpu"], design="genome")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_busy_share_sees_the_gpu_work():
    x = torch.randn(4096, 4096, device="cuda")
    wall, share = throughput.busy_share(lambda: [x @ x for _ in range(20)])
    assert wall > 0 and 0.5 < share <= 1.0 + 1e-6
    _, share_idle = throughput.busy_share(lambda: np.linalg.inv(np.random.default_rng(0).random((600, 600))))
    assert share_idle < 0.1
