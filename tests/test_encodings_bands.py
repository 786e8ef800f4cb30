"""Step III's multi-band map and its scale: bands=1 is the paper's φ = c·e, the low band stays within ±c, and the
scale/bands act whichever way the positions arrive (Poincaré e, recorded angles) or are refused (issue 33)."""

from __future__ import annotations

import json
import math

import anndata as ad
import numpy as np
import pytest
import torch
from _models_data import cape_adata, one_thread  # noqa: F401  (fixture)
from hypothesis import given, settings
from hypothesis import strategies as st

import cape
import cape.encodings as E
from cape import CapeInputError
from cape.cli import main
from cape.encodings import GenePositions
from cape.encodings.cape import band_frequencies, cape_angles, low_band, resolve_angles
from cape.models import CellTransformer, GeneVocab, gene_positions
from cape.models.positions import angle_record

C = math.pi / 4


def ball_points(seed: int, n: int = 12, d: int = 4) -> torch.Tensor:
    """n points strictly inside the unit ball, float64."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(n, d, generator=g, dtype=torch.float64)
    return e / e.norm(dim=1, keepdim=True) * torch.rand(n, 1, generator=g, dtype=torch.float64) * 0.999


def encoding(name: str, positions: GenePositions, d_model: int = 32, n_heads: int = 2, **kw):
    return E.get(name, d_model=d_model, n_heads=n_heads, n_layers=1, vocab_size=positions.vocab_size,
                 positions=positions, **kw)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.floats(0.01, 3.0), top=st.floats(1.0, 500.0))
def test_one_band_is_the_papers_map_exactly(seed, scale, top):
    e = ball_points(seed)
    assert torch.equal(cape_angles(e, scale, bands=1, top=top), e * scale)
    assert torch.equal(cape_angles(e), e * C)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), bands=st.integers(1, 6), top=st.floats(1.0, 200.0), scale=st.floats(0.05, 2.0))
def test_multi_band_table_shape_frequencies_and_low_band(seed, bands, top, scale):
    e = ball_points(seed, d=3)
    angles = cape_angles(e, scale, bands, top)
    assert angles.shape == (12, 3 * bands)
    omega = band_frequencies(bands, top)
    assert omega[0] == 1.0
    if bands > 1:
        torch.testing.assert_close(omega[-1], torch.tensor(top, dtype=torch.float64))
        ratios = omega[1:] / omega[:-1]
        torch.testing.assert_close(ratios, ratios[:1].expand_as(ratios))  # geometric, like RoPE's spectrum
    for b in range(bands):  # band-major: columns b·d … (b+1)·d − 1
        torch.testing.assert_close(angles[:, 3 * b:3 * (b + 1)], omega[b] * scale * e, rtol=1e-12, atol=1e-12)
    low = low_band(angles, bands)
    torch.testing.assert_close(low, scale * e, rtol=1e-12, atol=1e-12)
    assert low.abs().max() < scale  # ‖e‖ < 1: Props 4.1/4.2's regime on the low band


def test_band_options_are_validated():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(CapeInputError, match="bands"):
            band_frequencies(bad)
    with pytest.raises(CapeInputError, match="band_top"):
        band_frequencies(2, 0.5)
    with pytest.raises(CapeInputError, match="scale"):
        cape_angles(ball_points(0), -1.0)
    with pytest.raises(CapeInputError, match="3 bands"):
        low_band(torch.zeros(2, 4), 3)


def _recorded(e: torch.Tensor, scale: float = C, bands: int = 1, top: float = 64.0) -> GenePositions:
    return GenePositions(vectors=cape_angles(e, scale, bands, top).float(), vectors_are_angles=True,
                         angle_params={"scale": scale, "bands": bands, "band_top": top})


@pytest.mark.parametrize("route", ["poincare", "recorded angles (1 band)", "recorded angles (2 bands)"])
def test_scale_and_bands_act_whichever_way_the_positions_arrive(route):
    e = ball_points(3, n=10, d=4)
    positions = {"poincare": GenePositions(vectors=e.float()),
                 "recorded angles (1 band)": _recorded(e),
                 "recorded angles (2 bands)": _recorded(e, 0.3, 2, 8.0)}[route]
    enc = encoding("cape", positions, scale=2.0, bands=3, band_top=16.0)
    torch.testing.assert_close(enc.angle_table, cape_angles(e, 2.0, 3, 16.0).float(), rtol=1e-5, atol=1e-5)
    assert enc.effective_options()["scale"] == 2.0 and enc.effective_options()["bands"] == 3
    paper = encoding("cape_paper", positions, scale=0.5)
    torch.testing.assert_close(paper.angle_table, (0.5 * e).float(), rtol=1e-5, atol=1e-6)
    assert paper.effective_options()["bands"] == 1


def test_no_option_keeps_step_iii_angles_verbatim_and_cape_paper_takes_their_low_band():
    e = ball_points(4, n=10, d=4)
    positions = _recorded(e, 0.4, 4, 64.0)
    enc = encoding("cape", positions)
    assert torch.equal(enc.angle_table, positions.vectors)
    assert enc.effective_options() == {"scale": 0.4, "bands": 4, "band_top": 64.0, "from": "Step III angles"}
    paper = encoding("cape_paper", positions)
    torch.testing.assert_close(paper.angle_table, (0.4 * e).float(), rtol=1e-5, atol=1e-6)


def test_options_on_angles_of_unknown_scale_are_refused_in_one_line():
    e = ball_points(5, n=10, d=4)
    bare = GenePositions(vectors=(C * e).float(), vectors_are_angles=True)
    assert torch.equal(encoding("cape", bare).angle_table, bare.vectors)  # nothing asked: used as given
    for option in ({"scale": 1.0}, {"bands": 2}, {"band_top": 8.0}):
        with pytest.raises(CapeInputError, match="without their Step III record") as err:
            encoding("cape", bare, **option)
        assert "\n" not in str(err.value)
    with pytest.raises(CapeInputError, match="without their Step III record"):
        encoding("tape", bare, scale=1.0)
    with pytest.raises(CapeInputError, match="bands"):
        encoding("cape_paper", bare, bands=2)
    with pytest.raises(CapeInputError, match="unknown Step III option"):
        resolve_angles(bare, "cape", gain=2)


def test_bands_that_do_not_fit_the_planes_name_the_bands():
    positions = GenePositions(vectors=ball_points(6, n=10, d=8).float())  # 8 coordinates, 16 planes
    assert encoding("cape", positions, bands=2).angle_table.shape == (10, 16)
    with pytest.raises(CapeInputError, match="3 bands"):
        encoding("cape", positions, bands=3)
    with pytest.raises(CapeInputError, match="2 bands"):
        encoding("cape", positions, bands=2, mode="input", d_model=16)


def test_tape_initialisation_follows_the_same_map():
    e = ball_points(7, n=10, d=4)
    tape = encoding("tape", _recorded(e, 0.3, 2, 8.0), n_heads=2, scale=1.0, bands=2, band_top=4.0)
    width = tape.angle_table.shape[1]
    want = torch.nn.functional.pad(cape_angles(e, 1.0, 2, 4.0).float(), (0, width - 8))
    torch.testing.assert_close(tape.angle_table, want, rtol=1e-5, atol=1e-5)
    grape = encoding("grape_m", _recorded(e, 0.3, 2, 8.0))  # vectors back to e through the low band
    torch.testing.assert_close(grape.position_table, e.float(), rtol=1e-5, atol=1e-6)


# -- AnnData route: tl.rotary_encoding records the map, the model applies it or the one it is given ----------------

def test_rotary_encoding_records_bands_and_models_apply_them(tmp_path):
    adata = cape_adata(n_genes=12, dim=4)
    cape.tl.rotary_encoding(adata, bands=2, band_top=16.0)
    e = adata.varm["cape_poincare"]
    np.testing.assert_allclose(adata.varm["cape_angles"], np.hstack([C * e, 16 * C * e]), rtol=1e-12)
    rec = adata.uns["cape"]["rotary_encoding"]
    assert rec["params"]["bands"] == 2 and rec["params"]["band_top"] == 16.0
    assert rec["max_abs_angle_low_band"] < C
    assert angle_record(adata) == {"scale": C, "bands": 2, "band_top": 16.0}
    vocab = GeneVocab.from_genes(adata.var_names[adata.var["cape_used"].to_numpy()])
    pos = gene_positions(adata, vocab, "cape")
    assert pos.angle_params == {"scale": C, "bands": 2, "band_top": 16.0}
    model = CellTransformer(adata, "scgpt", "cape", d_model=16, n_heads=2, n_layers=1, max_len=16, seed=0)
    assert model.backbone.encoding.angle_table.shape[1] == 8
    record = model._record()["encoding_effective"]
    assert record["bands"] == 2 and record["from"] == "Step III angles"
    scaled = CellTransformer(adata, "scgpt", "cape", d_model=16, n_heads=2, n_layers=1, max_len=16, seed=0,
                             encoding_options={"scale": 0.1, "bands": 1})
    table = scaled.backbone.encoding.angle_table
    row = vocab.lookup([adata.var_names[0]])[0]
    np.testing.assert_allclose(table[row].numpy(), 0.1 * e[0], rtol=1e-5, atol=1e-6)
    assert scaled._record()["encoding_effective"]["scale"] == 0.1
    scaled.save(tmp_path / "model")  # the record travels with the positions: a reloaded model re-maps the same way
    loaded = CellTransformer.load(tmp_path / "model")
    assert torch.equal(loaded.backbone.encoding.angle_table, table)



def test_saved_angles_without_their_record_and_a_scale_are_refused(tmp_path):
    """A model folder whose angles lost their Step III record cannot re-map them for ``scale=``: one-line refusal
    (folders of unreleased versions that lacked the record are not special-cased)."""
    adata = cape_adata(n_genes=12, dim=4)
    cape.tl.rotary_encoding(adata)
    model = CellTransformer(adata, "scgpt", "cape", d_model=16, n_heads=2, n_layers=1, max_len=16, seed=0)
    model.save(tmp_path / "old")
    fields = torch.load(tmp_path / "old" / "positions.pt", weights_only=True)
    del fields["angle_params"]
    torch.save(fields, tmp_path / "old" / "positions.pt")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    config["backbone"]["encoding_options"] = {"scale": 0.5}
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CapeInputError, match="without their Step III record"):
        CellTransformer.load(tmp_path / "old")


def test_unrecorded_angles_with_poincare_coordinates_re_map_from_e():
    adata = cape_adata(n_genes=12, dim=4)  # angles = π/4·e with no Step III record
    vocab = GeneVocab.from_genes(adata.var_names[adata.var["cape_used"].to_numpy()])
    assert angle_record(adata) is None
    pos = gene_positions(adata, vocab, "cape", encoding_options={"scale": 2.0})
    assert not pos.vectors_are_angles  # read from varm['cape_poincare'], so scale=2 acts
    del adata.varm["cape_poincare"]
    pos = gene_positions(adata, vocab, "cape", encoding_options={"scale": 2.0})
    with pytest.raises(CapeInputError, match="Step III record"):
        encoding("cape", pos, scale=2.0)


def test_cape_encode_cli_writes_bands(tmp_path):
    adata = cape_adata(n_genes=12, dim=4)
    del adata.varm["cape_angles"]
    adata.write_h5ad(tmp_path / "in.h5ad")
    out = tmp_path / "out.h5ad"
    assert main(["--quiet", "encode", "-i", str(tmp_path / "in.h5ad"), "-o", str(out), "--bands", "3",
                          "--band-top", "9", "--scale", "0.5"]) == 0
    result = ad.read_h5ad(out)
    e = result.varm["cape_poincare"]
    np.testing.assert_allclose(result.varm["cape_angles"], np.hstack([0.5 * e, 1.5 * e, 4.5 * e]), rtol=1e-12)
    assert angle_record(result) == {"scale": 0.5, "bands": 3, "band_top": 9.0}
    assert main(["--quiet", "encode", "-i", str(tmp_path / "in.h5ad"), "-o", str(tmp_path / "x.h5ad"),
                          "--bands", "0"]) != 0
    assert not (tmp_path / "x.h5ad").exists()
