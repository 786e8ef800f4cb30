from __future__ import annotations

import json

import anndata as ad
import numpy as np
import pandas as pd
import pytest

from cape_benchmarks.cli import main


@pytest.fixture
def labelled_h5ad(tmp_path):
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 3, size=(3, 15))
    x = np.vstack([np.abs(c + rng.normal(size=(30, 15))) for c in centres]).astype(np.float32)
    adata = ad.AnnData(x, obs=pd.DataFrame({"kind": np.repeat(["a", "b", "c"], 30)},
                                           index=[f"c{i}" for i in range(90)]))
    adata.var_names = [f"g{i}" for i in range(15)]
    path = tmp_path / "blobs.h5ad"
    adata.write_h5ad(path)
    return path


@pytest.mark.parametrize("task,metrics", [("annotation", {"accuracy", "macro_f1"}),
                                          ("clustering", {"ARI", "NMI", "ASW"})])
def test_baselines_cli_writes_json_md_png(labelled_h5ad, tmp_path, task, metrics):
    out = tmp_path / "bench"
    rc = main(["--quiet", "baselines", "--task", task, "--dataset", str(labelled_h5ad), "--label-key", "kind",
               "--seeds", "0", "1", "--out", str(out)])
    assert rc == 0
    records = json.loads((out / f"baselines_{task}_blobs.json").read_text())
    assert {r["metric"] for r in records} == metrics
    assert {r["seed"] for r in records} == {0, 1}
    assert "mean ± sd" in (out / f"baselines_{task}_blobs.md").read_text()
    assert (out / f"baselines_{task}_blobs.png").stat().st_size > 0


def test_baselines_cli_needs_a_label_key(labelled_h5ad, tmp_path, capsys):
    rc = main(["baselines", "--task", "annotation", "--dataset", str(labelled_h5ad), "--out", str(tmp_path)])
    assert rc == 2
    assert "has no label key" in capsys.readouterr().err


def test_baselines_cli_missing_label_key(labelled_h5ad, tmp_path, capsys):
    rc = main(["baselines", "--task", "clustering", "--dataset", str(labelled_h5ad), "--label-key", "type",
               "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "label key obs['type'] not found" in err and "Traceback" not in err
    assert not list(tmp_path.glob("baselines_*"))  # nothing half-written
