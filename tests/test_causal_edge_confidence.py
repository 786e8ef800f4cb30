"""Edge confidence: each kept edge tested again given the child's other parents and the cells' state."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from scipy import stats

from cape import CapeInputError
from cape.causal import (
    MIN_DETECTED_CELLS,
    SOLID_CONFIDENCE,
    CausalConfig,
    cell_states,
    edge_confidence,
    edge_order,
    edge_tests,
    effective_cells,
    learn_causal_graph,
    selection_q_values,
    shrunk_partial_correlations,
)


def _mixture(n: int = 800, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Genes a, b differ between two cell types and are otherwise independent; c = 0.6·a + noise within each type;
    genes 3–12 are markers of the types (so that the cells cluster by type)."""
    rng = np.random.default_rng(seed)
    types = np.repeat([0, 1], n // 2)
    a = 3.0 * types + rng.normal(size=n)
    b = 3.0 * types + rng.normal(size=n)
    c = 0.6 * a + rng.normal(size=n)
    markers = 4.0 * types[:, None] + rng.normal(size=(n, 10))
    return np.column_stack([a, b, c, markers]), types


def _dag(m: int, edges: list[tuple[int, int]]) -> np.ndarray:
    dag = np.zeros((m, m))
    for i, j in edges:
        dag[i, j] = 0.5
    return dag


def test_a_dependence_the_cell_types_explain_is_a_guess_and_a_regulation_is_solid() -> None:
    X, types = _mixture()
    dag = _dag(X.shape[1], [(0, 1), (0, 2)])
    known = edge_confidence(X, dag, states=types)
    assert known.confidence[0, 2] >= SOLID_CONFIDENCE
    assert known.confidence[0, 1] < SOLID_CONFIDENCE
    found = edge_confidence(X, dag, seed=0)  # the Leiden states find the two types
    assert found.record["n_states"] == 2
    assert found.confidence[0, 2] >= SOLID_CONFIDENCE > found.confidence[0, 1]
    one_state = edge_confidence(X, dag, states=np.zeros(X.shape[0]))  # without states the types look like an edge
    assert one_state.confidence[0, 1] >= SOLID_CONFIDENCE


@pytest.mark.parametrize("detected", [2, MIN_DETECTED_CELLS - 1])
def test_genes_detected_in_the_same_few_cells_are_not_tested_and_stay_guesses(detected: int) -> None:
    """Two genes seen only in the same handful of cells correlate near 1 whatever their regulation; below
    MIN_DETECTED_CELLS cells their edge is not tested (p NaN, confidence 0); in a few times as many it is (a gene at
    varying levels in k cells varies in fewer than k by effective_cells)."""
    X, types = _mixture(400, seed=2)
    rng = np.random.default_rng(3)
    for cells in (detected, 3 * MIN_DETECTED_CELLS):
        rare = np.zeros((X.shape[0], 2))
        levels = rng.uniform(1.0, 3.0, size=(cells, 1)) + np.array([0.0, 0.1])
        rare[rng.choice(X.shape[0], cells, replace=False)] = levels
        Y = np.column_stack([X, rare])
        m = Y.shape[1]
        dag = _dag(m, [(0, 2), (m - 2, m - 1)])
        result = edge_confidence(Y, dag, states=types)
        assert result.partial_correlation[m - 2, m - 1] > 0.9  # what a test at face value would call solid
        assert result.confidence[0, 2] >= SOLID_CONFIDENCE
        if cells < MIN_DETECTED_CELLS:
            assert np.isnan(result.p_value[m - 2, m - 1]) and result.confidence[m - 2, m - 1] == 0.0
            assert result.record["n_untested"] == 1 and result.record["n_solid"] == 1
        else:
            assert result.confidence[m - 2, m - 1] >= SOLID_CONFIDENCE and result.record["n_untested"] == 0


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30), st.integers(0, 200))
@settings(max_examples=60, deadline=None)
def test_selection_q_values_are_bh_over_the_family_with_the_unseen_p_values_at_one(p: list[float], extra: int) -> None:
    p = np.asarray(p)
    assert np.allclose(selection_q_values(p), stats.false_discovery_control(p))
    family = selection_q_values(p, p.size + extra)
    assert np.allclose(family, stats.false_discovery_control(np.r_[p, np.ones(extra)])[:p.size])
    assert np.all(family >= selection_q_values(p) - 1e-15) and np.all(family <= 1.0)


def test_without_the_budget_the_confidence_counts_every_pair_the_graph_was_chosen_from() -> None:
    X, _ = _mixture(300, seed=4)
    config = CausalConfig(epochs=3, batch_size=64, tau=0.05)  # a fixed τ: no budget test of every pair
    graph = learn_causal_graph(X, np.array([f"g{i}" for i in range(X.shape[1])]), config, device="cpu")
    record = graph.record["edge_confidence"]
    assert "edge_budget" not in graph.record and record["n_hypotheses"] == 13 * 12 // 2
    edges = np.nonzero(graph.dag)
    alone = edge_confidence(X, graph.dag, seed=0)  # the same tests, their q-values over the edges alone
    p = np.nan_to_num(alone.p_value[edges], nan=1.0)
    assert np.allclose(graph.confidence[edges], 1.0 - selection_q_values(p, 78))
    assert np.allclose(alone.confidence[edges], 1.0 - selection_q_values(p))


def test_effective_cells_counts_the_cells_a_gene_varies_in() -> None:
    rng = np.random.default_rng(0)
    X = np.zeros((1000, 2))
    X[:7, 0] = 5.0  # detected in 7 cells at one level: 7 cells (up to the centring's share)
    X[:, 1] = rng.normal(size=1000)  # Gaussian: about n / 3
    cells = effective_cells(X - X.mean(axis=0))
    assert abs(cells[0] - 7) < 0.1 and abs(cells[1] - 1000 / 3) < 30
    assert np.allclose(effective_cells(3.0 * (X - X.mean(axis=0))), cells)


def test_confidence_lives_on_the_edges_only_and_in_the_unit_interval() -> None:
    X, types = _mixture(400, seed=1)
    dag = _dag(X.shape[1], [(0, 1), (0, 2), (3, 2), (4, 5)])
    result = edge_confidence(X, dag, states=types)
    off = dag == 0
    assert np.all(result.confidence[off] == 0) and np.all(np.isnan(result.p_value[off]))
    on = result.confidence[~off]
    assert np.all((on >= 0) & (on <= 1))
    assert result.record["n_solid"] == int((on >= SOLID_CONFIDENCE).sum())


def test_the_t_statistic_is_the_partial_correlations_given_states_and_other_parents() -> None:
    """t = r·√(df / (1 − r²)) with r the correlation of the residuals on the other covariates (Frisch–Waugh)."""
    rng = np.random.default_rng(2)
    n = 300
    X = rng.normal(size=(n, 4))
    X[:, 3] += 0.4 * X[:, 0] - 0.3 * X[:, 1]
    states = rng.integers(0, 3, n)
    t, p, partial = edge_tests(X, _dag(4, [(0, 3), (1, 3), (2, 3)]), states)
    covariates = np.column_stack([np.ones(n), states == 1, states == 2, X[:, 1], X[:, 2]]).astype(float)

    def residual(v):
        return v - covariates @ np.linalg.lstsq(covariates, v, rcond=None)[0]

    e0, e3 = residual(X[:, 0]), residual(X[:, 3])
    r = e0 @ e3 / np.sqrt((e0 @ e0) * (e3 @ e3))
    df = n - covariates.shape[1] - 1
    assert t[0, 3] == pytest.approx(r * np.sqrt(df / (1 - r * r)), rel=1e-8)
    assert partial[0, 3] == pytest.approx(r, rel=1e-8)  # the stored size is that partial correlation itself
    assert np.all(np.abs(partial) <= 1) and partial[0, 1] == 0
    assert 0 <= p[2, 3] <= 1 and p[0, 3] < 1e-6


def test_rescaling_a_parent_leaves_its_test_alone_and_a_sign_flip_flips_t() -> None:
    X, types = _mixture(300, seed=3)
    dag = _dag(X.shape[1], [(0, 2), (1, 2)])
    t, _, _ = edge_tests(X, dag, types)
    scaled = X.copy()
    scaled[:, 0] *= -7.5
    scaled[:, 0] += 3.0
    t2, _, _ = edge_tests(scaled, dag, types)
    assert t2[0, 2] == pytest.approx(-t[0, 2], rel=1e-8)
    assert t2[1, 2] == pytest.approx(t[1, 2], rel=1e-8)


def test_a_childs_intervened_cells_are_left_out_of_its_test() -> None:
    X, types = _mixture(400, seed=4)
    dag = _dag(X.shape[1], [(0, 2)])
    intervened = np.zeros(X.shape, dtype=bool)
    intervened[:100, 2] = True
    X_set = X.copy()
    X_set[:100, 2] = 0.0  # a knock-out sets the child from outside: those cells say nothing about a → c
    with_mask, _, _ = edge_tests(X_set, dag, types, sp.csr_matrix(intervened))
    kept_only, _, _ = edge_tests(X_set[100:], dag, types[100:])
    assert with_mask[0, 2] == pytest.approx(kept_only[0, 2], rel=1e-10)


def test_sparse_input_gives_the_dense_result_and_bad_states_are_refused() -> None:
    X, types = _mixture(300, seed=5)
    X = np.abs(X)
    dag = _dag(X.shape[1], [(0, 1), (0, 2)])
    dense = edge_confidence(X, dag, states=types)
    sparse = edge_confidence(sp.csr_matrix(X), dag, states=types)
    np.testing.assert_allclose(sparse.confidence, dense.confidence, rtol=1e-10)
    with pytest.raises(CapeInputError, match="cell states for 300 cells"):
        edge_confidence(X, dag, states=types[:10])
    with pytest.raises(CapeInputError, match="genes"):
        edge_tests(X, dag[:3, :3])
    assert cell_states(X[:10]).tolist() == [0] * 10  # too few cells for a kNN graph: one state


def test_the_pipeline_and_tl_store_the_confidence_beside_the_graph() -> None:
    import anndata as ad

    import cape

    X, _ = _mixture(400, seed=6)
    genes = np.array([f"g{i}" for i in range(X.shape[1])])
    config = CausalConfig(epochs=5, min_positioned=0, tau=0.05)
    result = learn_causal_graph(X, genes, config, seed=0)
    assert result.confidence is not None and result.confidence.shape == result.dag.shape
    assert np.all(result.confidence[result.dag == 0] == 0)
    adata = ad.AnnData(X.astype(np.float32), var={"gene": genes})
    adata.var_names = genes
    cape.tl.causal_graph(adata, config)
    stored = adata.varp["cape_dag_confidence"]
    assert (stored != 0).nnz <= adata.varp["cape_dag"].nnz
    np.testing.assert_array_equal(np.sort(stored.indices), np.sort(adata.varp["cape_dag"].indices))
    partial = adata.varp["cape_dag_partial_correlation"]
    np.testing.assert_array_equal(np.sort(partial.indices), np.sort(adata.varp["cape_dag"].indices))
    np.testing.assert_allclose(partial.toarray(), result.partial_correlation, atol=1e-6)
    # each edge's shrunk partial correlation given every other gene, at the graph's entries only
    edges = result.dag != 0
    np.testing.assert_allclose(result.pair_partial_correlation[edges], shrunk_partial_correlations(X)[edges],
                               rtol=1e-4, atol=1e-6)
    assert np.all(result.pair_partial_correlation[~edges] == 0)
    pair = adata.varp["cape_dag_pair_partial_correlation"]
    np.testing.assert_array_equal(np.sort(pair.indices), np.sort(adata.varp["cape_dag"].indices))
    np.testing.assert_allclose(pair.toarray(), result.pair_partial_correlation, atol=1e-6)
    assert "edge_confidence" in adata.uns["cape"]["causal_graph"]
    cape.tl.causal_graph(adata, config, edge_confidence=False)
    assert "cape_dag_confidence" not in adata.varp and "edge_confidence" not in adata.uns["cape"]["causal_graph"]
    assert "cape_dag_partial_correlation" not in adata.varp and "cape_dag_pair_partial_correlation" not in adata.varp


def test_drop_guesses_removes_exactly_the_edges_below_solid() -> None:
    X, _ = _mixture(400, seed=7)
    genes = np.array([f"g{i}" for i in range(X.shape[1])])
    config = CausalConfig(epochs=5, min_positioned=0, tau=0.05)
    kept = learn_causal_graph(X, genes, config, seed=0)
    guesses = (kept.dag != 0) & (kept.confidence < SOLID_CONFIDENCE)
    assert guesses.any()  # markers that only share the cell type: the fit links some of them
    dropped = learn_causal_graph(X, genes, CausalConfig(epochs=5, min_positioned=0, tau=0.05, drop_guesses=True),
                                 seed=0)
    np.testing.assert_array_equal(dropped.dag, np.where(guesses, 0.0, kept.dag))
    assert np.all(dropped.partial_correlation[dropped.dag == 0] == 0)
    assert np.all(dropped.pair_partial_correlation[dropped.dag == 0] == 0)
    assert dropped.record["edge_confidence"]["n_dropped_guesses"] == int(guesses.sum())
    assert dropped.record["n_edges"] == int(np.count_nonzero(dropped.dag))
    with pytest.raises(CapeInputError, match="drop_guesses needs edge_confidence"):
        CausalConfig(drop_guesses=True, edge_confidence=False)


def test_within_state_centring_gives_the_full_regressions_t() -> None:
    """Absorbing the intercept and state indicators by centring (Frisch–Waugh–Lovell) changes nothing: every edge's t
    equals the full design's, also where interventions leave a child's cells without one of the states."""
    rng = np.random.default_rng(5)
    n = 240
    X = rng.normal(size=(n, 5))
    X[:, 3] += 0.5 * X[:, 0] - 0.4 * X[:, 1] + 0.2 * X[:, 2]
    X[:, 4] += 0.3 * X[:, 3]
    states = rng.integers(0, 4, n)
    intervened = np.zeros((n, 5), dtype=bool)
    intervened[states == 2, 3] = True  # child 3 loses state 2 entirely
    intervened[:30, 4] = True
    dag = _dag(5, [(0, 3), (1, 3), (2, 3), (3, 4), (0, 4)])
    t, _, _ = edge_tests(X, dag, states, intervened)
    for j, parents in ((3, [0, 1, 2]), (4, [0, 3])):
        keep = ~intervened[:, j]
        levels = np.unique(states[keep])
        design = np.column_stack([np.ones(keep.sum()), *(states[keep] == s for s in levels[1:]), X[keep][:, parents]])
        beta, *_ = np.linalg.lstsq(design, X[keep, j], rcond=None)
        residual = X[keep, j] - design @ beta
        df = keep.sum() - design.shape[1]
        se = np.sqrt(np.diag(np.linalg.inv(design.T @ design)) * (residual @ residual) / df)
        np.testing.assert_allclose(t[parents, j], (beta / se)[-len(parents):], rtol=1e-9)


def test_p_is_the_larger_of_the_t_tests_and_the_full_designs_hc3_sandwich() -> None:
    """Each edge's p equals max(t test, HC3 test) of the regression written out with its intercept and state
    indicators (their leverage included), also where interventions leave a child's cells without a state; the
    stored t stays least squares'."""
    rng = np.random.default_rng(8)
    n = 200
    states = rng.integers(0, 3, n)
    scale = np.where(states == 0, 3.0, 0.7)[:, None]  # a spread that changes with the state
    X = rng.normal(size=(n, 4)) * scale
    X[:, 3] += 0.3 * X[:, 0] + 0.2 * X[:, 1]
    intervened = np.zeros((n, 4), dtype=bool)
    intervened[states == 2, 3] = True
    intervened[:20, 3] = True
    dag = _dag(4, [(0, 3), (1, 3), (2, 3)])
    t, p, _ = edge_tests(X, dag, states, intervened)
    keep = ~intervened[:, 3]
    levels = np.unique(states[keep])
    design = np.column_stack([np.ones(keep.sum()), *(states[keep] == s for s in levels[1:]), X[keep][:, :3]])
    y = X[keep, 3]
    inverse = np.linalg.inv(design.T @ design)
    beta = inverse @ design.T @ y
    residual = y - design @ beta
    df = keep.sum() - design.shape[1]
    hat = np.einsum("ij,jk,ik->i", design, inverse, design)
    sandwich = inverse @ (design.T * (residual / (1 - hat)) ** 2) @ design @ inverse
    classic = np.diag(inverse) * (residual @ residual) / df
    expected = np.maximum(2 * stats.t.sf(np.abs(beta / np.sqrt(classic)), df),
                          2 * stats.t.sf(np.abs(beta / np.sqrt(np.diag(sandwich))), df))[-3:]
    np.testing.assert_allclose(p[:3, 3], expected, rtol=1e-8)
    np.testing.assert_allclose(t[:3, 3], (beta / np.sqrt(classic))[-3:], rtol=1e-9)
    robust_only = 2 * stats.t.sf(np.abs(beta / np.sqrt(np.diag(sandwich))), df)[-3:]
    assert np.any(p[:3, 3] > 2 * stats.t.sf(np.abs(t[:3, 3]), df) * 1.01)  # here the sandwich is the larger p
    assert np.all(p[:3, 3] >= robust_only * (1 - 1e-9))


@pytest.mark.parametrize("kind", ["spread by hidden state", "detected in ~20 of 250 cells"])
def test_independent_genes_pass_the_edge_test_at_its_rate(kind: str) -> None:
    """Nulls that break one of the two tests: 400 independent parent–child pairs, one regression each. Hidden cell
    states that widen every gene's spread break the t test (about a quarter of the pairs at p < 0.05); genes detected
    in a handful of cells break the sandwich (about a fifth); the larger p holds 5 %."""
    rng = np.random.default_rng(11)
    n, pairs = 250, 400
    if kind.startswith("spread"):
        X = rng.normal(size=(n, 2 * pairs)) * np.where(rng.random(n) < 0.3, 4.0, 0.5)[:, None]
    else:
        depth = rng.lognormal(0.0, 0.4, n)[:, None]
        X = np.log1p(rng.negative_binomial(2, 2 / (2 + 0.08 * depth), size=(n, 2 * pairs)) / depth)
    dag = np.zeros((2 * pairs, 2 * pairs))
    dag[np.arange(0, 2 * pairs, 2), np.arange(1, 2 * pairs, 2)] = 1.0
    _, p, _ = edge_tests(X, dag)
    tested = p[np.arange(0, 2 * pairs, 2), np.arange(1, 2 * pairs, 2)]
    tested = tested[np.isfinite(tested)]
    assert tested.size > 0.8 * pairs
    assert np.mean(tested < 0.05) < 0.075


def test_edge_order_ranks_by_confidence_then_by_the_partial_correlations_size() -> None:
    confidence = np.array([1.0, 1.0, 0.97, 0.2, 1.0])
    partial = np.array([0.3, -0.6, 0.9, 0.95, 0.3])
    rank = edge_order(confidence, partial)
    assert rank[1] > rank[0] == rank[4] > rank[2] > rank[3]  # a confidence outranks any size; equal pairs tie
    grid = edge_order(confidence.reshape(5, 1), partial.reshape(5, 1))
    np.testing.assert_array_equal(grid.ravel(), rank)
    with pytest.raises(CapeInputError, match="partial correlations"):
        edge_order(confidence, partial[:3])


def test_edge_order_with_pair_partial_correlations_takes_the_weaker_of_the_two_ranks() -> None:
    confidence = np.array([1.0, 1.0, 1.0, 0.97, 0.2])
    partial = np.array([0.9, 0.6, 0.5, 0.9, 0.9])
    local = edge_order(confidence, partial)
    # pair partial correlations that agree with the local order leave it as it is
    np.testing.assert_array_equal(edge_order(confidence, partial, local + 0.5), local)
    # the locally most trusted edge, whose genes are nearly independent given every other gene, drops to the bottom
    pair = np.array([0.01, 0.5, 0.4, 0.3, 0.2])
    rank = edge_order(confidence, partial, pair)
    assert rank[0] == rank.min() and rank[1] > rank[2] > rank[3]
    # only the pair values' order counts (a monotone map changes nothing), and their sign does not
    np.testing.assert_array_equal(edge_order(confidence, partial, -np.sqrt(pair)), rank)
    with pytest.raises(CapeInputError, match="pair partial correlations"):
        edge_order(confidence, partial, pair[:3])


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 30), st.integers(0, 10_000))
def test_edge_order_never_ranks_an_edge_above_either_of_its_two_orders(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    confidence = rng.choice([1.0, 0.99, 0.5], n)
    partial, pair = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    rank = edge_order(confidence, partial, pair)
    local, by_pair = edge_order(confidence, partial), np.argsort(np.argsort(np.abs(pair)))
    for i in range(n):  # an edge below another on both orders is below it together
        below_both = (local[i] < local) & (by_pair[i] < by_pair)
        assert np.all(rank[i] < rank[below_both])


def test_edge_confidence_keeps_the_pair_partial_correlations_at_the_edges() -> None:
    X, types = _mixture(300, seed=9)
    dag = _dag(X.shape[1], [(0, 2), (1, 2)])
    pair = shrunk_partial_correlations(X)
    result = edge_confidence(X, dag, states=types, pair_partial_correlation=pair)
    np.testing.assert_array_equal(result.pair_partial_correlation, np.where(dag != 0, pair, 0.0))
    assert edge_confidence(X, dag, states=types).pair_partial_correlation is None
    with pytest.raises(CapeInputError, match="pair partial correlations"):
        edge_confidence(X, dag, pair_partial_correlation=pair[:3, :3])


def test_the_confidence_ties_that_the_partial_correlation_orders() -> None:
    """Many cells drive strong edges' q below float precision: their confidences tie at 1, their sizes do not."""
    rng = np.random.default_rng(8)
    n = 3000
    X = rng.normal(size=(n, 4))
    X[:, 3] += 0.9 * X[:, 0] + 0.5 * X[:, 1]
    result = edge_confidence(X, _dag(4, [(0, 3), (1, 3), (2, 3)]), states=np.zeros(n))
    assert result.confidence[0, 3] == result.confidence[1, 3] == 1.0
    assert abs(result.partial_correlation[0, 3]) > abs(result.partial_correlation[1, 3]) > 0.3
    rank = edge_order(result.confidence, result.partial_correlation)
    assert rank[0, 3] > rank[1, 3] > rank[2, 3]


def _one_factor(n: int = 500, m: int = 30, seed: int = 0) -> np.ndarray:
    """Every gene is one shared factor plus its own noise: each pair depends, but through all the others, so no pair's
    partial correlation given every other gene stands out (a shared factor such as the cells' depth)."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 1)) + rng.normal(size=(n, m))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.integers(0, 2**16), st.integers(0, 12))
def test_cap_unsupported_keeps_supported_edges_and_makes_the_rest_guesses(seed: int, n_supported: int) -> None:
    from scipy import stats

    from cape.causal import cap_unsupported

    rng = np.random.default_rng(seed)
    m = 6
    dag = np.triu(rng.random((m, m)) < 0.6, 1).astype(float)
    pairs = np.triu_indices(m, 1)
    p = rng.random(pairs[0].size) ** 3
    p[rng.random(p.size) < 0.1] = np.nan  # pairs the test could not judge
    confidence = np.where(dag != 0, rng.uniform(0.5, 1.0, (m, m)), 0.0)
    result = edge_confidence(rng.normal(size=(60, m)), dag)
    result.confidence = confidence
    capped = cap_unsupported(result, dag, (pairs, p), n_supported)
    tested = np.isfinite(p)
    q = np.ones(p.size)
    q[tested] = stats.false_discovery_control(p[tested])
    order = np.argsort(np.where(tested, p, np.inf), kind="stable")
    supported = np.zeros(p.size, dtype=bool)
    supported[order[:n_supported]] = True
    supported &= tested
    for k, (i, j) in enumerate(zip(*pairs, strict=True)):
        if not dag[i, j]:
            assert capped.confidence[i, j] == 0
        elif supported[k]:
            assert capped.confidence[i, j] == confidence[i, j]
        else:
            assert capped.confidence[i, j] < SOLID_CONFIDENCE
            assert capped.confidence[i, j] <= min(confidence[i, j], 1 - q[k])
    rows, cols = np.nonzero(dag)
    assert capped.record["n_solid"] == int(np.count_nonzero(capped.confidence[rows, cols] >= SOLID_CONFIDENCE))
    assert capped.record["n_pairs_supported"] == int(supported.sum())
    assert result.confidence is confidence  # the input is left as it was


def test_an_edge_whose_pair_the_budget_did_not_count_is_a_guess() -> None:
    """One shared factor: the fit links genes, each edge passes its test given the child's parents (the factor shows
    in every gene), but the budget's test given every other gene counts no pair; so no edge is solid."""
    X = _one_factor()
    genes = np.array([f"g{i}" for i in range(X.shape[1])])
    base = dict(epochs=20, min_positioned=0)
    result = learn_causal_graph(X, genes, CausalConfig(**base), seed=0)
    assert result.record["edge_budget"]["n_pairs"] == 0 and result.n_edges > 0
    record = result.record["edge_confidence"]
    assert record["n_pairs_supported"] == 0 and record["n_unsupported"] == result.n_edges
    assert record["n_solid"] == 0 and np.all(result.confidence[result.dag != 0] < SOLID_CONFIDENCE)
    # what the test given the parents and states alone says of the same edges: most of them solid
    alone = edge_confidence(X, result.dag, seed=0)
    assert alone.record["n_solid"] > result.n_edges // 2
    # a fixed threshold runs no budget test: the confidence is the test's alone
    fixed = learn_causal_graph(X, genes, CausalConfig(**base, tau=0.05), seed=0)
    assert "n_pairs_supported" not in fixed.record["edge_confidence"]
