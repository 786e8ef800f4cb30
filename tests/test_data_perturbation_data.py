from __future__ import annotations

import logging
from itertools import combinations

import anndata as ad
import networkx as nx
import numpy as np
import pandas as pd
import pytest

from cape import CapeInputError
from cape.data.perturbation_data import (
    gears_condition,
    random_dag,
    sachs_interventions,
    sem_sample,
    simulate_perturbation,
)


@pytest.fixture(scope="module")
def sim() -> ad.AnnData:
    return simulate_perturbation(n_genes=20, n_edges=30, n_control=60, n_cells_per_perturbation=10, n_single=8,
                                 n_double=6, seed=3)


def test_simulation_is_gears_format(sim):
    conds = sim.obs["condition"].astype(str)
    assert (conds == "ctrl").sum() == 60
    singles = [c for c in conds.unique() if c.endswith("+ctrl")]
    doubles = [c for c in conds.unique() if c != "ctrl" and not c.endswith("+ctrl")]
    assert len(singles) == 8 and len(doubles) == 6
    assert conds.value_counts()[singles[0]] == 10
    single_genes = {c.split("+")[0] for c in singles}
    for d in doubles:  # doubles pair single-perturbed genes
        a, b = d.split("+")
        assert a in single_genes and b in single_genes and a != b
    assert list(sim.var["gene_name"]) == list(sim.var_names)
    assert set(sim.obs["cell_type"]) == {"simulated"}
    assert sim.X.dtype == np.float32 and sim.X.min() >= 0 and np.isfinite(sim.X).all()
    dag = sim.varp["true_dag"].toarray()
    assert (dag != 0).sum() == 30
    assert nx.is_directed_acyclic_graph(nx.from_numpy_array(dag != 0, create_using=nx.DiGraph))


def test_knocked_genes_are_zero(sim):
    for cond in sim.obs["condition"].cat.categories[1:]:
        cells = sim[sim.obs["condition"] == cond]
        for gene in cond.split("+"):
            if gene != "ctrl":
                assert np.all(cells[:, gene].X == 0)


def test_simulation_is_deterministic(sim):
    again = simulate_perturbation(n_genes=20, n_edges=30, n_control=60, n_cells_per_perturbation=10, n_single=8,
                                  n_double=6, seed=3)
    np.testing.assert_array_equal(again.X, sim.X)
    assert list(again.obs["condition"]) == list(sim.obs["condition"])
    other = simulate_perturbation(n_genes=20, n_edges=30, n_control=60, n_cells_per_perturbation=10, n_single=8,
                                  n_double=6, seed=4)
    assert not np.array_equal(other.X, sim.X)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_knockout_reaches_exactly_the_descendants(seed):
    """With the same noise, do(k = 0) changes k and its descendants and leaves every other gene bit-identical."""
    rng = np.random.default_rng(seed)
    w = random_dag(12, 20, rng=rng)
    graph = nx.from_numpy_array(w != 0, create_using=nx.DiGraph)
    topo = list(nx.topological_sort(graph))
    basal = rng.uniform(0.5, 2.0, 12)
    k = next(g for g in topo if graph.out_degree(g) > 0)
    base = sem_sample(w, basal, topo, 40, (), 0.3, np.random.default_rng(7))
    knocked = sem_sample(w, basal, topo, 40, (k,), 0.3, np.random.default_rng(7))
    descendants = nx.descendants(graph, k)
    for g in range(12):
        if g == k:
            assert np.all(knocked[:, g] == 0)
        elif g not in descendants:
            np.testing.assert_array_equal(knocked[:, g], base[:, g])
    children = list(graph.successors(k))
    assert any(not np.allclose(knocked[:, c], base[:, c]) for c in children)


def test_random_dag_edge_count_and_bounds():
    w = random_dag(6, 15, weight_range=(0.5, 2.0), rng=np.random.default_rng(0))  # complete DAG on 6 nodes
    assert (w != 0).sum() == 15
    assert np.all((np.abs(w[w != 0]) >= 0.5) & (np.abs(w[w != 0]) <= 2.0))
    with pytest.raises(CapeInputError, match="n_edges must be in"):
        random_dag(6, 16, rng=np.random.default_rng(0))


@pytest.mark.parametrize("n_genes, n_edges, seed", [(2, 1, 0), (7, 9, 1), (40, 60, 2), (40, 0, 3)])
def test_random_dag_draws_the_pairs_of_listing_every_ordered_pair(n_genes, n_edges, seed):
    """The pairs are found by index arithmetic, not by listing the n(n − 1)/2 candidates: the same DAG as the
    listing, draw for draw."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(n_genes)
    upper = np.array(list(combinations(range(n_genes), 2)), dtype=int).reshape(-1, 2)
    chosen = upper[rng.choice(len(upper), size=n_edges, replace=False)]
    weights = rng.uniform(0.5, 2.0, size=n_edges) * rng.choice([-1.0, 1.0], size=n_edges)
    expected = np.zeros((n_genes, n_genes))
    expected[order[chosen[:, 0]], order[chosen[:, 1]]] = weights
    np.testing.assert_array_equal(random_dag(n_genes, n_edges, rng=np.random.default_rng(seed)), expected)


def test_simulation_rejects_impossible_requests():
    with pytest.raises(CapeInputError, match="n_double"):
        simulate_perturbation(n_genes=10, n_edges=10, n_single=3, n_double=4)
    with pytest.raises(CapeInputError, match="n_single"):
        simulate_perturbation(n_genes=5, n_edges=4, n_single=6, n_double=0)


def test_gears_condition_names():
    assert gears_condition(()) == "ctrl"
    assert gears_condition(("A",)) == "A+ctrl"
    assert gears_condition(("A", "B")) == "A+B"
    with pytest.raises(CapeInputError, match="at most 2"):
        gears_condition(("A", "B", "C"))


def _fake_sachs() -> ad.AnnData:
    """Shaped like cape.data.load('sachs2005'), small."""
    from cape.data.loaders import SACHS_CONDITIONS, SACHS_OBSERVATIONAL

    genes = ["praf", "pmek", "plcg", "PIP2", "PIP3", "p44/42", "pakts473", "PKA", "PKC", "P38", "pjnk"]
    rng = np.random.default_rng(0)
    conds = np.repeat([c for c, _, _ in SACHS_CONDITIONS], 5)
    targets = np.repeat([t or "none" for _, _, t in SACHS_CONDITIONS], 5)
    adata = ad.AnnData(rng.gamma(2.0, 30.0, size=(len(conds), 11)).astype(np.float32),
                       var=pd.DataFrame(index=genes))
    adata.obs_names = [f"c{i}" for i in range(adata.n_obs)]
    adata.obs["condition"] = pd.Categorical(conds)
    adata.obs["target"] = pd.Categorical(targets)
    adata.obs["observational"] = np.isin(conds, SACHS_OBSERVATIONAL)
    return adata


def test_sachs_interventions_to_gears(caplog):
    raw = _fake_sachs()
    with caplog.at_level(logging.WARNING, logger="cape"):
        out = sachs_interventions(raw)
    counts = out.obs["condition"].astype(str).value_counts()
    assert counts["ctrl"] == 10  # cd3cd28 + cd3cd28+icam2
    assert set(counts.index) == {"ctrl", "pakts473+ctrl", "PKC+ctrl", "PIP2+ctrl", "pmek+ctrl", "PIP3+ctrl",
                                 "PKA+ctrl"}
    # g0076 (PKC inhibitor) comes first in file order; pma (PKC activator) is dropped with a warning.
    assert set(out.obs.loc[out.obs["condition"] == "PKC+ctrl", "sachs_condition"]) == {"cd3cd28+g0076"}
    assert "pma" in caplog.text
    np.testing.assert_allclose(out.X, np.log1p(raw[out.obs_names].X), rtol=1e-6)
    assert list(out.var["gene_name"]) == list(raw.var_names)


def test_sachs_interventions_shared_targets_keeps_every_cell(caplog):
    raw = _fake_sachs()
    with caplog.at_level(logging.WARNING, logger="cape"):
        out = sachs_interventions(raw, shared_targets=True)
    assert out.n_obs == raw.n_obs  # every condition of the fake targets a measured protein
    assert set(out.obs.loc[out.obs["condition"] == "PKC+ctrl", "sachs_condition"]) == {"cd3cd28+g0076", "pma"}
    assert "pma" not in caplog.text
    assert list(out.obs["condition"].cat.categories).count("PKC+ctrl") == 1


def test_sachs_interventions_needs_its_columns():
    raw = _fake_sachs()
    del raw.obs["observational"]
    with pytest.raises(CapeInputError, match="observational"):
        sachs_interventions(raw)
    raw = _fake_sachs()
    raw.obs["observational"] = False
    with pytest.raises(CapeInputError, match="no observational cells"):
        sachs_interventions(raw)


def test_sem_hill_default_is_the_saturating_regulation_and_validates():
    """hill=(1, 1) is x / (1 + x) bit for bit (the perturbation benchmarks' data); (K, n) = (2, 2) is x²/(4 + x²)."""
    rng = np.random.default_rng(0)
    w = random_dag(8, 12, rng=rng)
    topo = list(nx.topological_sort(nx.from_numpy_array(w != 0, create_using=nx.DiGraph)))
    basal = rng.uniform(0.5, 2.0, 8)
    x = sem_sample(w, basal, topo, 30, (), 0.3, np.random.default_rng(1))
    eps = np.random.default_rng(1).normal(0.0, 0.3, size=x.shape)
    for j in topo:  # each gene from its parents' sampled values, by the formula
        p = np.flatnonzero(w[:, j])
        np.testing.assert_array_equal(x[:, j], np.logaddexp(0.0, basal[j] + (x[:, p] / (1.0 + x[:, p])) @ w[p, j]
                                                           + eps[:, j]))
        # the sum over every gene (zero weights for non-parents) is the same up to rounding
        np.testing.assert_allclose(x[:, j], np.logaddexp(0.0, basal[j] + (x / (1.0 + x)) @ w[:, j] + eps[:, j]),
                                   rtol=1e-13)
    x2 = sem_sample(w, basal, topo, 30, (), 0.3, np.random.default_rng(1), hill=(2.0, 2.0))
    for j in topo:
        np.testing.assert_allclose(x2[:, j], np.logaddexp(0.0, basal[j] + (x2**2 / (4.0 + x2**2)) @ w[:, j]
                                                          + eps[:, j]))
    with pytest.raises(CapeInputError, match="hill"):
        sem_sample(w, basal, topo, 5, (), 0.3, rng, hill=(0.0, 2.0))
