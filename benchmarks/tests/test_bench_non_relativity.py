"""``cape-bench non-relativity``: the command writes records, a table and a plot; a missing key is one line."""

from __future__ import annotations

import pytest
from _models_data import cape_adata, one_thread  # noqa: F401  (fixture)


@pytest.mark.usefixtures("one_thread")
def test_bench_non_relativity_writes_tables(tmp_path, capsys):
    import json

    from cape_benchmarks.cli import main

    adata = cape_adata(n_cells=24, n_genes=16)
    adata.write_h5ad(tmp_path / "encoded.h5ad")
    out = tmp_path / "bench"
    assert main(["--quiet", "non-relativity", "-i", str(tmp_path / "encoded.h5ad"), "--quick",
                 "--encodings", "none,rope", "--out", str(out)]) == 0
    records = json.loads((out / "non_relativity.json").read_text())
    seen = {(r["encoding"], r["key"], r["stage"]) for r in records}
    # `none` has no positions of its own: measured against the Poincaré distance only
    assert seen == {("none", "Poincaré distance", s) for s in ("initial", "trained")} | {
        ("rope", k, s) for k in ("own positions", "Poincaré distance") for s in ("initial", "trained")}
    assert (out / "non_relativity.png").stat().st_size > 0
    assert "| rope | own positions | trained |" in (out / "non_relativity.md").read_text()
    del adata.varm["cape_poincare"]
    adata.write_h5ad(tmp_path / "bare.h5ad")
    assert main(["non-relativity", "-i", str(tmp_path / "bare.h5ad"), "--out", str(tmp_path / "x")]) == 2
    assert "cape_poincare" in capsys.readouterr().err
