"""Orienting kept edges by the labelled interventions' downstream shifts (cape.causal.intervention_orientation)."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from scipy import stats

from cape.causal import descendant_evidence, is_dag, orient_by_shifts, shift_tests
from cape.causal.causal_config import CausalConfig
from cape.tl import causal_graph


def _chain_cells(seed: int, n_control: int = 400, n_knocked: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """g0 → g1 → g2 (linear, unit noise), g3 independent; then cells with g0 knocked out (set to −3), cells with g2
    knocked out and cells with g0 and g2 both knocked out. Returns X and the cells × genes intervention mask."""
    rng = np.random.default_rng(seed)
    blocks, masks = [], []
    for knocked in ((), (0,), (2,), (0, 2)):
        n = n_control if not knocked else n_knocked
        x0 = rng.normal(size=n) if 0 not in knocked else np.full(n, -3.0)
        x1 = x0 + rng.normal(size=n)
        x2 = x1 + rng.normal(size=n) if 2 not in knocked else np.full(n, -3.0) + 0.1 * rng.normal(size=n)
        blocks.append(np.c_[x0, x1, x2, rng.normal(size=n)])
        m = np.zeros((n, 4), dtype=bool)
        m[:, list(knocked)] = True
        masks.append(m)
    return np.vstack(blocks), np.vstack(masks)


def test_shift_tests_are_pooled_t_tests_of_the_single_target_cells_against_the_controls() -> None:
    X, mask = _chain_cells(0)
    P = shift_tests(X, mask)
    control = ~mask.any(1)
    for g in (0, 2):
        for j in range(4):
            if j == g:
                assert np.isnan(P[g, j])
                continue
            cells = mask[:, g] & (mask.sum(1) == 1)  # the double knock-outs' g0 would pass for g2's effect
            ref = stats.ttest_ind(X[cells, j], X[control, j], equal_var=True).pvalue
            assert P[g, j] == pytest.approx(ref, rel=1e-9, abs=1e-300)
    assert np.isnan(P[[1, 3]]).all()  # never intervened on: untested
    np.testing.assert_allclose(shift_tests(sp.csr_matrix(X), sp.csr_matrix(mask)), P, rtol=1e-12, equal_nan=True)


def test_column_moments_over_chunks_equal_numpys() -> None:
    from cape.causal.intervention_orientation import _column_moments

    X = np.random.default_rng(7).normal(size=(50, 4))
    X[X < 0] = 0.0
    rows = np.arange(3, 47)
    for data in (X, sp.csr_matrix(X)):
        mean, var, detected = _column_moments(data, rows, chunk=7)
        np.testing.assert_allclose(mean, X[rows].mean(0), rtol=1e-12)
        np.testing.assert_allclose(var, X[rows].var(0, ddof=1), rtol=1e-12)
        np.testing.assert_allclose(detected, (X[rows] != 0).mean(0), rtol=1e-12)


def test_shift_tests_keep_their_rate_on_sparse_null_counts() -> None:
    # Tens of intervened cells of a rarely detected gene are often all zero; Welch's t, or any t on such a mean,
    # would call that a shift. Genes detected in 30 % of the cells are tested and keep the rate; at 10 % they are not.
    for density, tested in ((0.3, True), (0.1, False)):
        X = sp.random(4000, 60, density=density, format="csr", random_state=0, dtype=np.float32)
        mask = np.zeros(X.shape, dtype=bool)
        for g in range(20):
            mask[3000 + 30 * g:3030 + 30 * g, g] = True
        P = shift_tests(X, mask)
        assert np.isfinite(P).any() == tested
        if tested:
            assert not descendant_evidence(P).any() and np.mean(P[np.isfinite(P)] < 0.05) < 0.08


def test_shift_tests_need_control_cells_and_enough_intervened_cells() -> None:
    X, mask = _chain_cells(1)
    assert np.isnan(shift_tests(X[mask.any(1)], mask[mask.any(1)])).all()  # no control cells
    few = mask.copy()
    few[:, 2] = False
    few[np.flatnonzero(mask[:, 2] & ~mask[:, 0])[:2], 2] = True  # two cells: below MIN_SHIFT_CELLS
    assert np.isnan(shift_tests(X, few)[2]).all()
    with pytest.raises(ValueError, match="shape"):
        shift_tests(X, mask[:10])


def test_descendant_evidence_is_benjamini_hochberg_over_the_tested_pairs() -> None:
    rng = np.random.default_rng(2)
    P = rng.uniform(size=(30, 30)) ** 3
    P[rng.uniform(size=P.shape) < 0.3] = np.nan
    tested = np.isfinite(P)
    for fdr in (0.05, 0.2):
        expected = np.zeros(P.shape, bool)
        expected[tested] = stats.false_discovery_control(P[tested], method="bh") <= fdr
        np.testing.assert_array_equal(descendant_evidence(P, fdr), expected)
    assert not descendant_evidence(np.full((3, 3), np.nan)).any()
    with pytest.raises(ValueError, match="fdr"):
        descendant_evidence(P, 1.0)


def test_a_reversed_edge_is_turned_and_supported_or_untested_edges_are_kept() -> None:
    X, mask = _chain_cells(3)
    evidence = descendant_evidence(shift_tests(X, mask))
    assert evidence[0, 1] and evidence[0, 2] and not evidence[2, 0] and not evidence[2, 1]
    fitted = np.zeros((4, 4))
    fitted[1, 0] = 0.7   # reversed: g1 shifts under do(g0), g0 does not move under do(g2): turn
    fitted[1, 2] = -0.4  # right: kept
    fitted[3, 1] = 0.2   # g3 and g1 never intervened on: no test, kept as fitted
    result = orient_by_shifts(fitted, evidence, n_tested=6)
    expected = np.zeros((4, 4))
    expected[0, 1], expected[1, 2], expected[3, 1] = 0.7, -0.4, 0.2
    np.testing.assert_array_equal(result.dag, expected)
    assert (result.n_turned, result.n_removed, result.n_supported) == (1, 0, 1)  # 0 → 1 is supported; 1 → 2 untested
    record = result.record(0.05, np.array(["a", "b", "c", "d"]))
    assert record["n_tested_pairs"] == 6 and "supported_source" not in result.record(0.05)
    assert list(record["supported_source"]) == ["a"] and list(record["supported_target"]) == ["b"]
    assert list(record["turned_source"]) == ["a"] and list(record["turned_target"]) == ["b"]


def test_evidence_both_ways_keeps_the_fit_and_cycles_from_turns_are_broken_lightest_first() -> None:
    both = np.zeros((3, 3), bool)
    both[0, 1] = both[1, 0] = True
    fitted = np.zeros((3, 3))
    fitted[1, 0] = 0.5
    np.testing.assert_array_equal(orient_by_shifts(fitted, both).dag, fitted)  # contradictory evidence: no turn
    # 0 → 1 → 2 and 0 → 2 fitted; the evidence says 0 descends from 2: 0 → 2 is turned, which closes
    # 2 → 0 → 1 → 2, and the lightest edge on that cycle (the turned one) goes.
    fitted = np.zeros((3, 3))
    fitted[0, 1], fitted[1, 2], fitted[0, 2] = 0.9, 0.8, 0.3
    evidence = np.zeros((3, 3), bool)
    evidence[2, 0] = True
    result = orient_by_shifts(fitted, evidence)
    assert is_dag(result.dag) and result.n_turned == 1 and result.n_removed == 1
    assert result.turned[0].size == 0  # the turned edge did not survive: none is listed
    assert result.dag[2, 0] == 0 and result.dag[0, 1] == 0.9 and result.dag[1, 2] == 0.8


def test_orientation_commutes_with_relabelling_the_genes() -> None:
    X, mask = _chain_cells(4)
    rng = np.random.default_rng(4)
    fitted = np.triu(rng.normal(size=(4, 4)), 1).T  # a DAG with every pair
    order = rng.permutation(4)
    evidence = descendant_evidence(shift_tests(X, mask))
    permuted = descendant_evidence(shift_tests(X[:, order], mask[:, order]))
    np.testing.assert_array_equal(permuted, evidence[np.ix_(order, order)])
    np.testing.assert_array_equal(orient_by_shifts(fitted[np.ix_(order, order)], permuted).dag,
                                  orient_by_shifts(fitted, evidence).dag[np.ix_(order, order)])


def _chain_adata(seed: int) -> ad.AnnData:
    X, mask = _chain_cells(seed)
    labels = np.array(["ctrl" if not m.any() else
                       "+".join([f"g{g}" for g in np.flatnonzero(m)] + (["ctrl"] if m.sum() == 1 else []))
                       for m in mask])
    a = ad.AnnData(X.astype(np.float32), var=pd.DataFrame(index=[f"g{i}" for i in range(4)]))
    a.obs_names = [f"c{i}" for i in range(a.n_obs)]
    a.obs["condition"] = pd.Categorical(labels)
    return a


def test_causal_graph_orients_by_the_labels_and_records_it(monkeypatch, tmp_path) -> None:
    import cape.causal.pipeline as tl_causal

    seen = []
    real = tl_causal.fit_variational_notears

    def spy(X, **kwargs):
        seen.append(kwargs.get("intervened"))
        return real(X, **kwargs)

    monkeypatch.setattr(tl_causal, "fit_variational_notears", spy)
    a = _chain_adata(5)
    causal_graph(a, rank=None, tau=0.0, epochs=10, batch_size=128, device="cpu", interventions="condition",
                 min_positioned=0)
    record = a.uns["cape"]["causal_graph"]
    assert seen[-1] is not None and record["params"]["leave_out_targets"] and record["params"]["orient_by_shifts"]
    orientation = record["orientation"]
    assert orientation["fdr"] == 0.05 and orientation["n_tested_pairs"] == 6  # do(g0), do(g2) × 3 other genes
    assert orientation["n_shifted_pairs"] >= 2  # g1 and g2 move under do(g0)
    dag = a.varp["cape_dag"].toarray()
    assert is_dag(dag) and dag[1, 0] == 0 and dag[2, 0] == 0  # nothing points into the knocked-out source g0
    assert record["n_edges"] == np.count_nonzero(dag)
    named = set(zip(orientation["supported_source"], orientation["supported_target"], strict=True))
    assert len(named) == orientation["n_edges_supported"] and all(dag[int(s[1]), int(t[1])] for s, t in named)
    assert {s for s, _ in named} <= {"g0", "g2"}  # only a perturbed gene's edges can be supported
    a.write_h5ad(tmp_path / "oriented.h5ad")
    back = ad.read_h5ad(tmp_path / "oriented.h5ad").uns["cape"]["causal_graph"]["orientation"]
    assert list(back["supported_source"]) == list(orientation["supported_source"])

    b = _chain_adata(5)
    causal_graph(b, rank=None, tau=0.0, epochs=10, batch_size=128, device="cpu", interventions="condition",
                 min_positioned=0, leave_out_targets=False, orient_by_shifts=False)
    assert seen[-1] is None and "orientation" not in b.uns["cape"]["causal_graph"]
    assert not b.uns["cape"]["causal_graph"]["params"]["leave_out_targets"]


@pytest.mark.parametrize("name", ["leave_out_targets", "orient_by_shifts"])
def test_the_switches_must_be_booleans(name) -> None:
    with pytest.raises(Exception, match=f"{name} must be true or false"):
        CausalConfig(**{name: "yes"})
