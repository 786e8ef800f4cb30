"""cape.tl.predict_intervention, cape.pl.intervention and `cape predict`."""

from __future__ import annotations

import warnings

import anndata as ad
import matplotlib
import numpy as np
import pandas as pd
import pytest

import cape
from cape import CapeInputError
from cape.cli import main

matplotlib.use("agg")


def _chain_cells(n=300, seed=0) -> ad.AnnData:
    """A → B → C (strong), D → E, F alone; non-negative, log-expression-like."""
    rng = np.random.default_rng(seed)
    a = 2.0 + 0.5 * rng.normal(size=n)
    b = 1.0 + 0.9 * a + 0.2 * rng.normal(size=n)
    c = 0.5 + 0.8 * b + 0.2 * rng.normal(size=n)
    d = 2.0 + 0.5 * rng.normal(size=n)
    e = 3.0 - 0.7 * d + 0.2 * rng.normal(size=n)
    f = 1.5 + 0.3 * rng.normal(size=n)
    X = np.column_stack([a, b, c, d, e, f]).clip(0, None).astype(np.float32)
    return ad.AnnData(X, obs=pd.DataFrame(index=[f"c{i}" for i in range(n)]),
                      var=pd.DataFrame(index=["GATA1", "SPI1", "CEBPA", "TAL1", "KLF1", "MYB"]))


@pytest.fixture(scope="module")
def fitted() -> ad.AnnData:
    adata = _chain_cells()
    cape.tl.causal_graph(adata, rank=None, tau=0.05, epochs=40, seed=0, min_positioned=0.0)
    return adata


def _source_gene(adata) -> str:
    eq = adata.uns["cape"]["causal_graph"]["equations"]
    return str(eq["genes"][int(eq["source"][0])])


def test_causal_graph_stores_its_equations(fitted, tmp_path):
    eq = fitted.uns["cape"]["causal_graph"]["equations"]
    assert eq["kind"] == "learned" and eq["layer"] == "X"
    assert list(eq["genes"]) == list(fitted.var_names)
    np.testing.assert_allclose(eq["obs_mean"], fitted.X.mean(0), rtol=1e-5)
    assert len(eq["source"]) == fitted.varp["cape_dag"].nnz
    fitted.write_h5ad(tmp_path / "c.h5ad")
    back = ad.read_h5ad(tmp_path / "c.h5ad")
    cape.tl.predict_intervention(back, {_source_gene(back): "0.5x"})
    a = fitted.copy()
    cape.tl.predict_intervention(a, {_source_gene(a): "0.5x"})
    np.testing.assert_array_equal(back.layers["cape_intervention"], a.layers["cape_intervention"])


def test_counterfactual_writes_layer_shift_and_uns(fitted):
    a = fitted.copy()
    gene = _source_gene(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cape.tl.predict_intervention(a, {gene: "ko"}, key_added="ko")
    rec = a.uns["ko"]
    assert rec["intervention"] == {gene: 0.0} and rec["mode"] == "counterfactual" and rec["n_cells"] == a.n_obs
    assert np.all(a.layers["ko"][:, a.var_names.get_loc(gene)] == 0)
    reached = set(rec["descendants"])
    assert reached
    for g in a.var_names:
        if g != gene and g not in reached:
            np.testing.assert_array_equal(a.layers["ko"][:, a.var_names.get_loc(g)], a.X[:, a.var_names.get_loc(g)])
            assert a.var.loc[g, "ko_shift"] == 0.0
    assert any(a.var.loc[g, "ko_shift"] != 0 for g in reached)
    np.testing.assert_allclose(a.var["ko_shift"], a.layers["ko"].mean(0) - a.X.mean(0), atol=1e-5)


def test_multiple_of_mean_and_copy(fitted):
    gene = _source_gene(fitted)
    out = cape.tl.predict_intervention(fitted, {gene: "1.5x"}, copy=True)
    assert "cape_intervention" not in fitted.uns
    mean = float(fitted.X[:, fitted.var_names.get_loc(gene)].mean())
    assert out.uns["cape_intervention"]["intervention"][gene] == pytest.approx(1.5 * mean, rel=1e-5)


def test_interventional_returns_new_cells(fitted):
    gene = _source_gene(fitted)
    cells = cape.tl.predict_intervention(fitted.copy(), {gene: "1.2x"}, mode="interventional", n_cells=400, seed=1,
                                         equations="linear")
    assert cells.shape == (400, fitted.n_vars) and "reference" in cells.layers
    np.testing.assert_allclose(cells.var["cape_intervention_shift"],
                               cells.X.mean(0) - cells.layers["reference"].mean(0), atol=1e-4)
    fig = cape.pl.intervention(cells, return_fig=True)
    assert fig.axes[0].get_title().startswith("do(")


def test_linear_on_another_graph(fitted):
    a = fitted.copy()
    truth = np.zeros((6, 6))
    truth[0, 1] = truth[1, 2] = 1.0
    a.varp["consensus"] = truth
    cape.tl.predict_intervention(a, {"GATA1": 3.0}, equations="linear", graph="consensus")
    assert a.uns["cape_intervention"]["descendants"] == ["SPI1", "CEBPA"]
    # slope of B on A ≈ 0.9, of C on B ≈ 0.8
    shift = a.var["cape_intervention_shift"]
    change = 3.0 - float(a.X[:, 0].mean())
    assert shift["SPI1"] == pytest.approx(0.9 * change, rel=0.1)
    assert shift["CEBPA"] == pytest.approx(0.72 * change, rel=0.15)


def test_bad_input(fitted):
    with pytest.raises(CapeInputError, match=r"'GATA' is not in the causal graph \(closest: GATA1"):
        cape.tl.predict_intervention(fitted.copy(), {"GATA": 0})
    with pytest.raises(CapeInputError, match="run cape.tl.causal_graph"):
        cape.tl.predict_intervention(_chain_cells(), {"GATA1": 0})
    with pytest.raises(CapeInputError, match="expected a number"):
        cape.tl.predict_intervention(fitted.copy(), {"GATA1": "lots"})
    with pytest.raises(CapeInputError, match="mode"):
        cape.tl.predict_intervention(fitted.copy(), {"GATA1": 0}, mode="observational")
    with pytest.warns(UserWarning, match="outside the observed range"):
        cape.tl.predict_intervention(fitted.copy(), {"GATA1": 100.0})
    with pytest.warns(UserWarning, match="no descendants.*no-change baseline"):
        cape.tl.predict_intervention(fitted.copy(), {"MYB": "1.1x"})


def test_cli_predict_writes_outputs(fitted, tmp_path):
    src = tmp_path / "causal.h5ad"
    fitted.write_h5ad(src)
    out, table, plot = tmp_path / "p.h5ad", tmp_path / "s.tsv", tmp_path / "s.png"
    rc = main(["--quiet", "predict", "-i", str(src), "--intervene", f"{_source_gene(fitted)}=0.5x", "MYB=1.6",
               "--output", str(out), "--table", str(table), "--plot", str(plot)])
    assert rc == 0
    assert "cape_intervention" in ad.read_h5ad(out).layers
    shifts = pd.read_csv(table, sep="\t")
    assert list(shifts.columns) == ["gene", "role", "shift"]
    assert plot.stat().st_size > 0


def test_cli_predict_table_lists_only_the_reached_genes(fitted, tmp_path, caplog):
    src = tmp_path / "causal.h5ad"
    fitted.write_h5ad(src)
    source, table = _source_gene(fitted), tmp_path / "s.tsv"
    with caplog.at_level("INFO", logger="cape"):
        assert main(["predict", "-i", str(src), "--intervene", f"{source}=0.5x", "--output",
                     str(tmp_path / "p.h5ad"), "--table", str(table)]) == 0
    record = ad.read_h5ad(tmp_path / "p.h5ad").uns["cape_intervention"]
    reached = {source, *map(str, record["descendants"])}
    shifts = pd.read_csv(table, sep="\t")
    assert set(shifts["gene"]) == reached and len(shifts) < fitted.n_vars
    assert dict(zip(shifts["gene"], shifts["role"], strict=True))[source] == "intervened"
    assert f"{fitted.n_vars - len(reached)} left out" in caplog.text


@pytest.mark.parametrize("args,words", [
    (["--intervene", "GATA"], "expected GENE=VALUE"),
    (["--intervene", "GATA=0"], "closest: GATA1"),
    (["--intervene", "GATA1=x2"], "expected a number"),
])
def test_cli_predict_errors_are_one_line_without_outputs(fitted, tmp_path, capsys, args, words):
    src = tmp_path / "causal.h5ad"
    fitted.write_h5ad(src)
    rc = main(["predict", "-i", str(src), *args, "--output", str(tmp_path / "p.h5ad"),
               "--plot", str(tmp_path / "p.png")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["causal.h5ad"]


def test_cli_predict_without_step_one(tmp_path, capsys):
    src = tmp_path / "plain.h5ad"
    _chain_cells().write_h5ad(src)
    rc = main(["predict", "-i", str(src), "--intervene", "GATA1=0", "--output", str(tmp_path / "p.h5ad")])
    err = capsys.readouterr().err
    assert rc == 2 and "cape causal" in err and not (tmp_path / "p.h5ad").exists()


def test_equivalence_class_averages_the_orientations_of_the_graph(fitted, tmp_path, monkeypatch):
    a = fitted.copy()
    chain = np.zeros((6, 6))
    chain[0, 1] = chain[1, 2] = 1.0  # GATA1 → SPI1 → CEBPA: observationally, the other orientations fit as well
    a.varp["chain"] = chain
    cape.tl.predict_intervention(a, {"SPI1": 3.0}, equations="equivalence_class", graph="chain")
    out = a.uns["cape_intervention"]
    assert list(out["parent_sets"]) == ["", "GATA1", "CEBPA"] and out["graph"] == "chain"
    per_set = np.asarray(out["shift_per_parent_set"])
    shift = a.var["cape_intervention_shift"].to_numpy()
    np.testing.assert_allclose(shift[[0, 2]], per_set.mean(0)[[0, 2]], rtol=1e-6)
    change = 3.0 - float(a.X[:, 1].mean())
    # CEBPA moves by the slope 0.8 under two of the three parent sets, not at all when it is SPI1's parent
    assert per_set[2, 2] == 0.0 and per_set[1, 2] == pytest.approx(0.8 * change, rel=0.1)
    assert shift[2] == pytest.approx(2 / 3 * 0.8 * change, rel=0.1)
    assert per_set[1, 0] == 0.0 and (shift[3:] == 0).all()  # GATA1 as the parent; D, E, F unrelated
    assert set(out["descendants"]) == {"GATA1", "CEBPA"}
    for kwargs in ({"n_cells": 50}, {"mode": "interventional", "n_cells": 80}):  # on any cells: the sets' mean
        b = cape.tl.predict_intervention(a, {"SPI1": 3.0}, equations="equivalence_class", graph="chain", copy=True,
                                         **kwargs)
        others = [0, 2, 3, 4, 5]  # SPI1's own shift is not per parent set
        np.testing.assert_allclose(b.var["cape_intervention_shift"].to_numpy()[others],
                                   np.asarray(b.uns["cape_intervention"]["shift_per_parent_set"]).mean(0)[others],
                                   atol=1e-9)
    np.testing.assert_array_equal(a.layers["cape_intervention"][:, 3:], a.X[:, 3:])
    with pytest.raises(CapeInputError, match="one intervened gene at a time"):
        cape.tl.predict_intervention(a.copy(), {"SPI1": 3.0, "TAL1": 2.0}, equations="equivalence_class", graph="chain")
    with pytest.warns(UserWarning, match="no descendants"):
        cape.tl.predict_intervention(a.copy(), {"MYB": 1.0}, equations="equivalence_class", graph="chain")
    a.varp["complete"] = np.triu(np.ones((6, 6)), 1)  # SPI1's class allows 2^5 parent sets
    with monkeypatch.context() as m:
        m.setattr("cape.tl._predict_intervention.MAX_PARENT_SETS", 8)
        with pytest.raises(CapeInputError, match="SPI1 has more than 8 possible parent sets"):
            cape.tl.predict_intervention(a.copy(), {"SPI1": 3.0}, equations="equivalence_class", graph="complete")
    src, dst = tmp_path / "c.h5ad", tmp_path / "p.h5ad"
    a.write_h5ad(src)
    assert main(["--quiet", "predict", "-i", str(src), "--intervene", "SPI1=3", "--equations", "equivalence_class",
                 "--graph", "chain", "--output", str(dst)]) == 0
    np.testing.assert_allclose(ad.read_h5ad(dst).var["cape_intervention_shift"], shift, rtol=1e-6)
    fig = cape.pl.intervention(a, return_fig=True)
    (whiskers,) = [c for c in fig.axes[0].containers if type(c).__name__ == "ErrorbarContainer"]
    segments = whiskers.lines[2][0].get_segments()  # one per bar, bars from the smallest |shift| up
    bars = sorted([0, 2], key=lambda i: abs(shift[i]))  # GATA1 and CEBPA, the genes SPI1 can reach
    for segment, gene in zip(segments, bars, strict=True):
        # each whisker spans the gene's shift under the parent sets, 0 among them (the set where it is SPI1's parent)
        np.testing.assert_allclose(np.sort(segment[:, 0]), [per_set[:, gene].min(), per_set[:, gene].max()])
        assert per_set[:, gene].min() == 0.0
    assert "parent sets" in fig.axes[0].get_xlabel()
    matplotlib.pyplot.close(fig)


def test_an_effect_through_guessed_edges_warns_and_is_counted(fitted):
    import scipy.sparse as sp

    adata = fitted.copy()
    source = _source_gene(adata)
    confidence = sp.csr_matrix(adata.varp["cape_dag_confidence"], copy=True)
    confidence.data[:] = 1.0
    adata.varp["cape_dag_confidence"] = confidence
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cape.tl.predict_intervention(adata, {source: "ko"})
    assert not [w for w in caught if "guesses" in str(w.message)]  # every edge solid: no such warning
    record = adata.uns["cape_intervention"]
    assert record["n_guess_edges_travelled"] == 0 and record["n_edges_travelled"] >= 1
    confidence.data[:] = 0.5
    adata.varp["cape_dag_confidence"] = confidence
    with pytest.warns(UserWarning, match=rf"of the \d+ edges the effect of {source} travels are guesses"):
        cape.tl.predict_intervention(adata, {source: "ko"})
    assert adata.uns["cape_intervention"]["n_guess_edges_travelled"] == record["n_edges_travelled"]


def test_a_chain_keeps_its_edges_solid_and_an_independent_gene_is_a_guess(fitted):
    """On the chain cells, the edges of the true chain are solid; an edge to MYB (independent of all) is a guess."""
    dag, confidence = fitted.varp["cape_dag"].toarray(), fitted.varp["cape_dag_confidence"].toarray()
    names = list(fitted.var_names)
    true = {("GATA1", "SPI1"), ("SPI1", "CEBPA"), ("TAL1", "KLF1")}
    for i, j in zip(*np.nonzero(dag), strict=True):
        pair = (names[i], names[j])
        if pair in true or pair[::-1] in true:
            assert confidence[i, j] >= cape.causal.SOLID_CONFIDENCE, pair
        elif "MYB" in pair:
            assert confidence[i, j] < cape.causal.SOLID_CONFIDENCE, pair
