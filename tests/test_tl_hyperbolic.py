"""cape.tl.hyperbolic_embedding / rotary_encoding / cape, and the `cape embed` / `cape encode` CLI."""

from __future__ import annotations

import math

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import spearmanr

import cape
from cape import CapeInputError
from cape.cli import main
from cape_benchmarks.embedding import barabasi_albert_dag


def make_adata(n_genes: int = 20, seed: int = 0) -> ad.AnnData:
    rng = np.random.default_rng(seed)
    adata = ad.AnnData(rng.poisson(2.0, (30, n_genes)).astype(np.float32))
    adata.var_names = [f"g{i}" for i in range(n_genes)]
    adata.varp["cape_dag"] = barabasi_albert_dag(n_genes, 2, seed=seed)
    return adata


def test_hyperbolic_embedding_sets_fields():
    adata = make_adata()
    assert cape.tl.hyperbolic_embedding(adata, dim=4, epochs=20) is None
    assert adata.varm["cape_lorentz"].shape == (20, 5)
    assert adata.varm["cape_poincare"].shape == (20, 4)
    assert np.linalg.norm(adata.varm["cape_poincare"], axis=1).max() < 1
    assert adata.var["cape_generality"].sum() == pytest.approx(1.0)
    assert adata.var["cape_embedded"].all()
    info = adata.uns["cape"]["hyperbolic_embedding"]
    assert info["params"]["dim"] == 4 and info["seed"] == 0 and info["params"]["negatives"] == "none"
    assert info["params"]["temperature"] == 0.5  # the default τ
    assert "geoopt" in info["versions"]


def test_copy_leaves_input_untouched_and_euclidean_removes_lorentz():
    adata = make_adata()
    out = cape.tl.hyperbolic_embedding(adata, dim=3, epochs=5, copy=True)
    assert "cape_poincare" not in adata.varm and "cape_poincare" in out.varm
    cape.tl.hyperbolic_embedding(out, dim=3, epochs=5, geometry="euclidean")
    assert "cape_lorentz" not in out.varm and out.varm["cape_euclidean"].shape == (20, 3)
    assert out.uns["cape"]["hyperbolic_embedding"]["params"]["geometry"] == "euclidean"


def test_generality_zero_outside_used_genes():
    adata = make_adata()
    used = np.ones(20, dtype=bool)
    used[-3:] = False
    dag = sp.lil_matrix(adata.varp["cape_dag"])
    dag[:, -3:] = 0
    dag[-3:, :] = 0
    adata.varp["cape_dag"] = dag.tocsr()
    adata.var["cape_used"] = used
    cape.tl.hyperbolic_embedding(adata, dim=2, epochs=5)
    assert np.all(adata.var["cape_generality"].to_numpy()[-3:] == 0)
    assert adata.var["cape_generality"].sum() == pytest.approx(1.0)
    np.testing.assert_array_equal(adata.varm["cape_poincare"][-3:], 0.0)


def test_rotary_encoding_angles(caplog):
    adata = make_adata()
    cape.tl.hyperbolic_embedding(adata, dim=4, epochs=10)
    with caplog.at_level("INFO", logger="cape"):
        cape.tl.rotary_encoding(adata)
    assert "Step III: 4 angles per gene for 20 genes (scale 0.785, 1 band(s))" in caplog.text  # `cape encode` says it
    np.testing.assert_allclose(adata.varm["cape_angles"], adata.varm["cape_poincare"] * math.pi / 4)
    assert np.abs(adata.varm["cape_angles"]).max() < math.pi / 4
    cape.tl.rotary_encoding(adata, scale=1.0, key_added="phi")
    np.testing.assert_allclose(adata.varm["phi"], adata.varm["cape_poincare"])


def test_missing_keys_and_bad_adjacency_are_one_line_errors():
    adata = make_adata()
    del adata.varp["cape_dag"]
    with pytest.raises(CapeInputError, match=r"varp\['cape_dag'\] not found.*cape causal") as err:
        cape.tl.hyperbolic_embedding(adata, epochs=1)
    assert "\n" not in str(err.value)
    with pytest.raises(CapeInputError, match=r"varm\['cape_poincare'\] not found.*cape embed"):
        cape.tl.rotary_encoding(adata)
    with pytest.raises(CapeInputError, match="square"):
        cape.tl.hyperbolic_embedding(adata, adjacency=np.zeros((20, 19)), epochs=1)
    with pytest.raises(CapeInputError, match="has 20 genes"):
        cape.tl.hyperbolic_embedding(adata, adjacency=np.zeros((5, 5)), epochs=1)
    cyc = np.zeros((20, 20))
    cyc[0, 1] = cyc[1, 2] = cyc[2, 0] = 1.0
    with pytest.raises(CapeInputError, match="directed cycle: g0 -> g1 -> g2 -> g0"):
        cape.tl.hyperbolic_embedding(adata, adjacency=cyc, epochs=1)
    loop = np.zeros((20, 20))
    loop[4, 4] = 1.0
    with pytest.raises(CapeInputError, match="self-loop on gene g4"):
        cape.tl.hyperbolic_embedding(adata, adjacency=loop, epochs=1)
    with pytest.raises(CapeInputError, match="dim must be"):
        cape.tl.hyperbolic_embedding(make_adata(), dim=1, epochs=1)
    with pytest.raises(CapeInputError, match="scale"):
        cape.tl.rotary_encoding(make_adata(), scale=-1.0)


def test_empty_graph_warns_and_places_genes_at_origin_only_on_request(caplog):
    adata = make_adata()
    adata.varp["cape_dag"] = sp.csr_matrix((20, 20))
    with caplog.at_level("WARNING", logger="cape"):
        cape.tl.hyperbolic_embedding(adata, dim=3, epochs=5, isolated="origin")
    assert "no edges" in caplog.text
    np.testing.assert_array_equal(adata.varm["cape_poincare"], 0.0)
    assert adata.uns["cape"]["hyperbolic_embedding"]["fraction_at_origin"] == 1.0
    cape.tl.hyperbolic_embedding(adata, dim=3, epochs=100)
    assert adata.uns["cape"]["hyperbolic_embedding"]["fraction_at_origin"] == 0.0
    assert not adata.var["cape_connected"].any() and adata.var["cape_embedded"].all()


def test_genes_outside_cape_used_stay_at_origin_and_do_not_count():
    adata = make_adata()
    dag = sp.lil_matrix(adata.varp["cape_dag"])
    unused = np.array([17, 18])
    dag[unused, :] = 0
    dag[:, unused] = 0
    adata.varp["cape_dag"] = dag.tocsr()
    used = np.ones(adata.n_vars, dtype=bool)
    used[unused] = False
    adata.var["cape_used"] = used
    cape.tl.hyperbolic_embedding(adata, dim=3, epochs=100)
    np.testing.assert_array_equal(adata.varm["cape_poincare"][unused], 0.0)
    assert adata.uns["cape"]["hyperbolic_embedding"]["fraction_at_origin"] == 0.0


def test_cli_embed_and_encode_roundtrip(tmp_path, capsys):
    adata = make_adata()
    src = tmp_path / "causal.h5ad"
    adata.write_h5ad(src)
    emb, enc = tmp_path / "embedded.h5ad", tmp_path / "encoded.h5ad"
    assert main(["--quiet", "--seed", "3", "embed", "-i", str(src), "-o", str(emb), "--dim", "4",
                 "--epochs", "10", "--negatives", "8", "--temperature", "1"]) == 0
    assert main(["--quiet", "encode", "-i", str(emb), "-o", str(enc)]) == 0
    out = ad.read_h5ad(enc)
    assert out.varm["cape_angles"].shape == (20, 4)
    assert out.uns["cape"]["hyperbolic_embedding"]["seed"] == 3
    assert out.uns["cape"]["hyperbolic_embedding"]["params"]["negatives"] == 8
    assert out.uns["cape"]["hyperbolic_embedding"]["params"]["temperature"] == 1.0
    np.testing.assert_allclose(out.varm["cape_angles"], out.varm["cape_poincare"] * math.pi / 4)


def test_cli_errors_are_one_line_and_leave_no_output(tmp_path, capsys):
    adata = make_adata()
    del adata.varp["cape_dag"]
    src = tmp_path / "pre.h5ad"
    adata.write_h5ad(src)
    out = tmp_path / "embedded.h5ad"
    assert main(["--quiet", "embed", "-i", str(src), "-o", str(out), "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cape: error: varp['cape_dag'] not found") and "\n" not in err
    assert not out.exists()
    assert main(["--quiet", "encode", "-i", str(src), "-o", str(out)]) == 2
    assert "cape embed" in capsys.readouterr().err
    assert not list(tmp_path.glob("*embedded*"))


def test_cape_runs_steps_one_to_three_in_order(monkeypatch):
    # Step I itself is tested with its own module; here a fast stand-in records the call and writes a DAG.
    import importlib

    pipeline = importlib.import_module("cape.tl._pipeline")  # where cape.tl.cape looks Step I up

    calls = {}

    def fake_causal_graph(adata, **kwargs):
        calls.update(kwargs)
        adata.varp["cape_dag"] = barabasi_albert_dag(adata.n_vars, 2, seed=1)

    monkeypatch.setattr(pipeline, "causal_graph", fake_causal_graph)
    adata = make_adata()
    del adata.varp["cape_dag"]
    out = cape.tl.cape(adata, dim=4, epochs=10, seed=5, causal_kwargs={"epochs": 3}, copy=True)
    assert "cape_dag" not in adata.varp
    assert calls == {"device": "auto", "seed": 5, "epochs": 3}
    assert out.varm["cape_angles"].shape == (20, 4)
    assert out.uns["cape"]["pipeline"]["steps"] == ["causal_graph", "hyperbolic_embedding", "rotary_encoding"]
    assert out.uns["cape"]["hyperbolic_embedding"]["seed"] == 5


def _tree_adata(n: int = 31) -> ad.AnnData:
    """A binary tree of depth 4 (root -> leaves) plus three genes without an edge."""
    rows = (np.arange(1, n) - 1) // 2
    dag = sp.csr_matrix((np.ones(n - 1), (rows, np.arange(1, n))), shape=(n + 3, n + 3))
    adata = ad.AnnData(np.ones((5, n + 3), dtype=np.float32))
    adata.var_names = [f"g{i}" for i in range(n + 3)]
    adata.varp["cape_dag"] = dag
    return adata


def test_hierarchy_is_recorded_over_the_genes_with_an_edge(caplog):
    adata = _tree_adata()
    with caplog.at_level("WARNING", logger="cape"):
        cape.tl.hyperbolic_embedding(adata, dim=2, epochs=400, temperature=1.0)
    info = adata.uns["cape"]["hyperbolic_embedding"]
    assert info["hierarchy_n_genes"] == 31
    norms = np.linalg.norm(adata.varm["cape_poincare"][:31], axis=1)
    rho = spearmanr(adata.var["cape_generality"].to_numpy()[:31], -norms).statistic
    assert info["hierarchy_spearman"] == pytest.approx(rho)
    assert info["hierarchy_spearman"] >= 0.5
    assert "hierarchy" not in caplog.text


def test_missing_hierarchy_is_warned(caplog):
    adata = _tree_adata()
    with caplog.at_level("WARNING", logger="cape"):
        # no optimisation from a zero start: every gene at the origin, the norms order nothing
        cape.tl.hyperbolic_embedding(adata, dim=2, epochs=0, init_scale=0.0)
    info = adata.uns["cape"]["hyperbolic_embedding"]
    assert np.isnan(info["hierarchy_spearman"]) and info["hierarchy_n_genes"] == 31
    assert "do not follow the graph's hierarchy" in caplog.text and "not a causal hierarchy" in caplog.text
    assert "-norm) is undefined over the 31 genes with an edge" in caplog.text
