"""Controls of ``cape-bench encodings`` (issue 33): random directions keep every norm, permuted labels are a
permutation of the same positions and graph, both deterministic per seed; bands reach Step III; the rows run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from _models_data import cape_adata, one_thread  # noqa: F401  (fixture)
from hypothesis import given, settings
from hypothesis import strategies as st

import cape
from cape import CapeInputError
from cape.data.perturbation_data import simulate_perturbation
from cape.encodings.ordering import topological_positions
from cape_benchmarks import encodings as be
from cape_benchmarks import encodings_controls as bc
from cape_benchmarks import encodings_models as bm

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = bm.BenchSettings(n_genes=24, d_model=8, n_layers=1, n_heads=2, max_len=16, batch_size=16, pretrain_epochs=1,
                        fine_tune_epochs=1, patience=1, causal_epochs=2, causal_tau=0.01, causal_rank=4, embed_dim=2,
                        bands=2, band_top=8.0, embed_epochs=10, corr_neighbors=3, predictor_epochs=3)


def position_set(seed: int = 0, bands: int = 2):
    """A position set as Steps I–III leave it: Poincaré points, Lorentz points, recorded angles, a DAG."""
    adata = cape_adata(n_genes=16, dim=3, seed=seed)
    del adata.varm["cape_angles"]
    adata.varm["cape_lorentz"] = cape.hyperbolic.poincare.poincare_to_lorentz(
        torch.from_numpy(adata.varm["cape_poincare"])).numpy()
    cape.tl.rotary_encoding(adata, scale=0.5, bands=bands, band_top=8.0)
    return adata


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_random_directions_keep_every_norm_and_re_run_step_iii(seed):
    adata = position_set()
    out = bc.random_directions(adata, seed)
    e, f = adata.varm["cape_poincare"], out.varm["cape_poincare"]
    np.testing.assert_allclose(np.linalg.norm(f, axis=1), np.linalg.norm(e, axis=1), rtol=1e-12, atol=1e-15)
    used = adata.var["cape_used"].to_numpy()
    assert not np.allclose(f[used], e[used])                          # directions did change
    np.testing.assert_array_equal(f[~used], e[~used])                 # genes without a position untouched
    np.testing.assert_allclose(out.varm["cape_angles"], np.hstack([0.5 * f, 4.0 * f]), rtol=1e-12)  # same map
    back = cape.hyperbolic.poincare.lorentz_to_poincare(torch.from_numpy(out.varm["cape_lorentz"]))
    np.testing.assert_allclose(back.numpy(), f, atol=1e-12)
    assert (out.varp["cape_dag"] != adata.varp["cape_dag"]).nnz == 0  # the graph is kept
    np.testing.assert_array_equal(bc.random_directions(adata, seed).varm["cape_poincare"], f)  # deterministic
    assert not np.allclose(bc.random_directions(adata, seed + 1).varm["cape_poincare"][used], f[used])
    assert "cape_angles" in adata.varm and np.array_equal(adata.varm["cape_poincare"], e)  # input not modified


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_permuted_labels_are_a_permutation_of_positions_graph_and_generality(seed):
    adata = position_set()
    out = bc.permute_genes(adata, seed)
    used = np.flatnonzero(adata.var["cape_used"].to_numpy())
    e, f = adata.varm["cape_poincare"], out.varm["cape_poincare"]
    # the map gene -> source gene, read back from the (distinct) Poincaré rows
    source = np.array([int(np.flatnonzero((e == row).all(axis=1))[0]) for row in f])
    assert sorted(source[used]) == sorted(used)                       # a permutation of the positioned genes
    np.testing.assert_array_equal(source[np.setdiff1d(np.arange(16), used)], np.setdiff1d(np.arange(16), used))
    for key in ("cape_angles", "cape_lorentz"):
        np.testing.assert_array_equal(out.varm[key], adata.varm[key][source])
    np.testing.assert_array_equal(out.var["cape_generality"].to_numpy(),
                                  adata.var["cape_generality"].to_numpy()[source])
    a, b = sp.csr_matrix(adata.varp["cape_dag"]).toarray(), sp.csr_matrix(out.varp["cape_dag"]).toarray()
    np.testing.assert_array_equal(b, a[np.ix_(source, source)])      # the same graph, relabelled
    np.testing.assert_array_equal(bc.permute_genes(adata, seed).varm["cape_poincare"], f)


def test_permuted_dag_gives_rope_a_random_order():
    adata = position_set()
    used = adata.var["cape_used"].to_numpy()
    orders = [topological_positions(bc.permute_genes(adata, s).varp["cape_dag"], used=used) for s in range(4)]
    for order in orders:
        assert sorted(order[used]) == list(range(int(used.sum())))   # still a rank 0 … n−1
    assert len({tuple(o[used]) for o in orders}) == 4


def test_apply_control_names_unknown_controls():
    adata = position_set()
    assert bc.apply_control(adata, None, 0) is adata
    with pytest.raises(CapeInputError, match="unknown control 'shuffle'"):
        bc.apply_control(adata, "shuffle", 0)
    del adata.varm["cape_poincare"]
    with pytest.raises(CapeInputError, match="cape_poincare"):
        bc.apply_control(adata, "permuted", 0)


def test_control_variants_and_bands_setting():
    rows = {v.name: v for v in bm.variants(["cape_oracle_random_directions", "cape_oracle_permuted",
                                            "rope_random_order", "cape_paper_oracle", "cape_paper"])}
    assert (rows["cape_oracle_random_directions"].encoding, rows["cape_oracle_random_directions"].positions,
            rows["cape_oracle_random_directions"].control) == ("cape", "true_dag", "random_directions")
    assert rows["cape_oracle_permuted"].control == "permuted" and rows["rope_random_order"].encoding == "rope"
    assert (rows["cape_paper_oracle"].encoding, rows["cape_paper_oracle"].positions) == ("cape_paper", "true_dag")
    assert rows["cape_paper"].positions == "cape"
    assert bm.BenchSettings(d_model=64, bands=4).embed_dim == 8     # d·bands fills the D/2 planes
    assert bm.BenchSettings.for_mode(True, bands=2).embed_dim == 8 and bm.BenchSettings.for_mode(True).embed_dim == 16


def test_control_rows_run_with_their_seed_and_read_multi_band_angles(monkeypatch, tmp_path):
    data = simulate_perturbation(n_genes=16, n_edges=24, n_control=60, n_cells_per_perturbation=8, n_single=4,
                                 n_double=2, seed=0)
    seen = {}
    real = be.build_model

    def spy(pos, backbone, variant, settings_, seed, device=None, integration="complement"):
        model = real(pos, backbone, variant, settings_, seed, device, integration)
        seen[(variant.name, seed)] = (pos.uns["cape"].get("control"), model.backbone.encoding.angle_table.shape[1]
                                      if hasattr(model.backbone.encoding, "angle_table") else None)
        return model

    monkeypatch.setattr(be, "build_model", spy)
    names = ["cape_oracle", "cape_paper_oracle", "cape_oracle_random_directions", "cape_oracle_permuted"]
    result = be.run_encodings_benchmark(data, "perturbation", seeds=[0, 1], encoding_names=names,
                                        backbones=["scgpt"], integrations=["replace"], settings=TINY,
                                        out=tmp_path, dataset="sim")
    md = result.paths["md"].read_text()
    assert "cape_oracle_permuted: the genes' labels are permuted" in md and "Step III: 2 bands" in md
    assert "| cape_oracle_random_directions |" in md.replace("scgpt (replace) ", "")
    paired = json.loads(result.paths["paired"].read_text())
    assert {r["encoding"] for r in paired if r["reference"] == "cape_oracle"} >= {"cape_oracle_permuted",
                                                                                 "cape_oracle_random_directions"}
    assert seen[("cape_oracle", 0)] == (None, 4)                      # 2 coordinates × 2 bands
    assert seen[("cape_paper_oracle", 0)] == (None, 2)                # the low band of the same e
    assert seen[("cape_oracle_random_directions", 1)] == ({"name": "random_directions", "seed": 1}, 4)
    assert seen[("cape_oracle_permuted", 0)][0] == {"name": "permuted", "seed": 0}
    models = [r for r in result.records if r["kind"] == "model"]
    assert {r["encoding"] for r in models} == set(names)             # controls are not merged with cape_oracle
    assert all(r["control_seed"] == r["seed"] for r in models if r.get("control"))


@pytest.mark.parametrize(("bands", "built"), [(1, ["cape"]), (2, ["cape", "cape_paper"])])
def test_cape_paper_is_the_cape_model_when_step_iii_wrote_one_band(built_models, bands, built):
    data = simulate_perturbation(n_genes=16, n_edges=24, n_control=60, n_cells_per_perturbation=8, n_single=4,
                                 n_double=2, seed=0)
    settings_ = bm.BenchSettings(**{**TINY.__dict__, "bands": bands, "embed_dim": 2})
    records = be.run_encodings_benchmark(data, "perturbation", seeds=[0], encoding_names=["cape", "cape_paper"],
                                         backbones=["scgpt"], integrations=["replace"], settings=settings_,
                                         out=None).records
    assert built_models == built
    paper = [r for r in records if r["kind"] == "model" and r["encoding"] == "cape_paper"]
    assert paper and all((r.get("same_run_as") == "cape") == (bands == 1) for r in paper)
