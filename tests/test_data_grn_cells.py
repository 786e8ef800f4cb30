"""The oracle experiment's simulation: cell types from regulator programs on a known DAG, counts with technical
noise, GEARS-format knock-outs."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scanpy as sc

from cape import CapeInputError
from cape.data import CountNoise, simulate_grn_cells

SMALL = dict(n_genes=40, n_edges=70, n_control=300, n_cell_types=3, n_programs=3, n_single=6, n_double=4,
             n_cells_per_perturbation=10)


@pytest.fixture(scope="module")
def sim():
    return simulate_grn_cells(**SMALL, seed=3)


def test_shape_keys_and_gears_conditions(sim):
    assert sim.shape == (300 + 10 * 10, 40)
    counts = sim.layers["counts"].toarray()
    assert np.all(counts == np.round(counts)) and counts.min() >= 0
    expected = sim.copy()
    expected.X = sim.layers["counts"].copy()
    sc.pp.normalize_total(expected, target_sum=1e4)
    sc.pp.log1p(expected)
    np.testing.assert_allclose(sim.X.toarray(), expected.X.toarray(), rtol=1e-5, atol=1e-6)
    ctrl = sim.obs["condition"] == "ctrl"
    assert ctrl.sum() == 300 and sim.obs.loc[ctrl, "cell_type"].value_counts().tolist() == [100, 100, 100]
    singles = [c for c in sim.obs["condition"].cat.categories if c.endswith("+ctrl")]
    doubles = [c for c in sim.obs["condition"].cat.categories if c != "ctrl" and not c.endswith("+ctrl")]
    assert len(singles) == 6 and len(doubles) == 4
    single_genes = {c.split("+")[0] for c in singles}
    assert all(set(d.split("+")) <= single_genes for d in doubles)  # doubles pair single-perturbed genes
    dag = sim.varp["true_dag"].toarray()
    assert (dag != 0).sum() == 70
    assert nx.is_directed_acyclic_graph(nx.from_numpy_array(dag != 0, create_using=nx.DiGraph))


def test_knocked_genes_have_no_transcripts(sim):
    counts = sim.layers["counts"].toarray()
    for condition in sim.obs["condition"].cat.categories[1:]:
        genes = [g for g in condition.split("+") if g != "ctrl"]
        cells = (sim.obs["condition"] == condition).to_numpy()
        assert counts[np.ix_(cells, sim.var_names.get_indexer(genes))].sum() == 0


def test_programs_are_the_widest_regulators_and_define_the_cell_types(sim):
    dag = sim.varp["true_dag"].toarray() != 0
    graph = nx.from_numpy_array(dag, create_using=nx.DiGraph)
    reach = np.array([len(nx.descendants(graph, g)) for g in range(dag.shape[0])])
    programs = np.flatnonzero(sim.var["program"].to_numpy() >= 0)
    assert len(programs) == 3 and reach[programs].min() >= np.sort(reach)[-3]
    codes = sim.uns["simulation"]["codes"]
    assert len({tuple(c) for c in codes.values()}) == 3 and all(any(c) for c in codes.values())
    ctrl = sim[sim.obs["condition"] == "ctrl"]
    x = ctrl.X.toarray()
    for gene in programs:
        on = [t for t, c in codes.items() if c[sim.var["program"].iloc[gene]]]
        on_cells = ctrl.obs["cell_type"].isin(on).to_numpy()
        if 0 < on_cells.sum() < len(on_cells):
            assert x[on_cells, gene].mean() > x[~on_cells, gene].mean() + 1.0


def test_genes_outside_every_program_do_not_separate_the_cell_types():
    # Genes that no program reaches have the same distribution in every cell type (up to sampling).
    sim = simulate_grn_cells(**{**SMALL, "n_control": 3000, "n_single": 0, "n_double": 0}, seed=5)
    dag = sim.varp["true_dag"].toarray() != 0
    graph = nx.from_numpy_array(dag, create_using=nx.DiGraph)
    programs = np.flatnonzero(sim.var["program"].to_numpy() >= 0)
    reached = set(programs).union(*[nx.descendants(graph, int(p)) for p in programs])
    counts = sim.layers["counts"].toarray()
    frac = counts / counts.sum(axis=1, keepdims=True)
    types = sim.obs["cell_type"].to_numpy()
    spread = lambda g: np.ptp([frac[types == t, g].mean() for t in np.unique(types)]) / frac[:, g].mean()  # noqa: E731
    outside = [g for g in range(40) if g not in reached and frac[:, g].mean() > 0.005]
    codes = np.array(list(sim.uns["simulation"]["codes"].values()))
    inside = [g for g in programs if codes[:, sim.var["program"].iloc[g]].std() > 0]  # on in some types only
    assert outside, "the test needs genes no program reaches"
    # Library-size normalisation couples genes a little; the programs' own shifts are an order larger.
    assert max(spread(g) for g in outside) < 0.5 * min(spread(g) for g in inside)


def test_seeded():
    a, b = simulate_grn_cells(**SMALL, seed=1), simulate_grn_cells(**SMALL, seed=1)
    c = simulate_grn_cells(**SMALL, seed=2)
    assert (a.layers["counts"] != b.layers["counts"]).nnz == 0
    assert (a.layers["counts"] != c.layers["counts"]).nnz > 0


@pytest.mark.parametrize("kwargs, words", [
    (dict(n_cell_types=8, n_programs=3), "7 distinct cell-type codes"),
    (dict(n_double=100), "exceeds"),
    (dict(n_programs=0), "n_programs"),
])
def test_bad_arguments(kwargs, words):
    with pytest.raises(CapeInputError, match=words):
        simulate_grn_cells(**{**SMALL, **kwargs})


def test_true_edges_are_visible_through_the_technical_noise():
    """Parent and child correlate in the log-normalised counts clearly more than unrelated genes: the structure
    the oracle arm is given is in the data a learner sees (with x/(1+x) and noise 0.3 it was not)."""
    sim = simulate_grn_cells(**{**SMALL, "n_genes": 60, "n_edges": 90, "n_control": 1500, "n_single": 0,
                                "n_double": 0}, seed=2)
    x = sim.X.toarray()
    corr = np.nan_to_num(np.corrcoef(x.T))
    edges = sim.varp["true_dag"].toarray() != 0
    unrelated = ~(edges | edges.T | np.eye(60, dtype=bool))
    assert np.abs(corr[edges]).mean() > 3.0 * np.abs(corr[unrelated]).mean()  # 2.2 with x/(1+x), noise 0.3


def test_count_noise_is_validated_and_changes_only_the_counts():
    with pytest.raises(CapeInputError, match="dispersion > 0"):
        CountNoise(dispersion=0.0)
    base = simulate_grn_cells(**SMALL, seed=4)
    deep = simulate_grn_cells(**SMALL, seed=4, counts=CountNoise(depth=20_000.0, dropout_midpoint=0.0))
    np.testing.assert_array_equal(base.varp["true_dag"].toarray(), deep.varp["true_dag"].toarray())
    assert deep.uns["simulation"]["depth"] == 20_000.0
    # deeper sequencing without dropout: fewer zeros than the default's shallow, dropping counts
    assert (deep.layers["counts"].toarray() == 0).mean() < (base.layers["counts"].toarray() == 0).mean()
