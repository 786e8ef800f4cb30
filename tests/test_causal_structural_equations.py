"""do() on structural equations: exact properties of cape.causal.structural_equations."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from cape.causal import (
    ElementwiseMLP,
    StructuralEquations,
    fit_variational_notears,
    intervene,
    learned_equations,
    linear_equations,
    make_dag,
    topological_order,
)
from cape.causal import structural_equations as se


def _chain_linear(weights=(2.0, -0.5), intercept=(1.0, 0.5, -1.0)) -> StructuralEquations:
    """A → B → C with known weights (genes 0, 1, 2)."""
    return StructuralEquations("linear", source=[0, 1], target=[1, 2], weight=list(weights), order=[0, 1, 2],
                               intercept=list(intercept))


def _chain_data(n=200, seed=0):
    rng = np.random.default_rng(seed)
    a = 1.0 + rng.normal(size=n)
    b = 0.5 + 2.0 * a + rng.normal(size=n)
    c = -1.0 - 0.5 * b + rng.normal(size=n)
    return np.column_stack([a, b, c])


def test_linear_chain_counterfactual_shift_is_analytic():
    eq, X = _chain_linear(), _chain_data()
    predicted, reference = intervene(eq, X, {0: 3.0})
    assert np.array_equal(reference, X)
    np.testing.assert_allclose(predicted[:, 0], 3.0)
    np.testing.assert_allclose(predicted[:, 1] - X[:, 1], 2.0 * (3.0 - X[:, 0]))
    np.testing.assert_allclose(predicted[:, 2] - X[:, 2], -0.5 * 2.0 * (3.0 - X[:, 0]))
    # the mean shift of C is the product of the path's weights times the change of A
    assert predicted[:, 2].mean() - X[:, 2].mean() == pytest.approx(-1.0 * (3.0 - X[:, 0].mean()))


def test_linear_chain_interventional_mean_matches_the_sem():
    eq, X = _chain_linear(), _chain_data(n=4000)
    predicted, reference = intervene(eq, X, {1: 0.0}, mode="interventional", n_cells=4000, seed=1)
    assert predicted.shape == (4000, 3)
    np.testing.assert_array_equal(predicted[:, 0], reference[:, 0])  # upstream of the intervention: untouched
    assert np.all(predicted[:, 1] == 0.0)
    # E[C | do(B = 0)] = −1 + E[e_C] (= 0 up to sampling noise)
    assert predicted[:, 2].mean() == pytest.approx(-1.0, abs=0.08)


def test_do_on_middle_gene_cuts_its_parents():
    eq, X = _chain_linear(), _chain_data()
    predicted, _ = intervene(eq, X, {1: 5.0})
    assert np.array_equal(predicted[:, 0], X[:, 0])
    np.testing.assert_allclose(predicted[:, 2] - X[:, 2], -0.5 * (5.0 - X[:, 1]))


def test_linear_equations_recover_known_weights():
    X = _chain_data(n=20000, seed=3)
    dag = np.zeros((3, 3))
    dag[0, 1] = dag[1, 2] = 1.0
    eq = linear_equations(X, dag)
    np.testing.assert_allclose(eq.weight, [2.0, -0.5], atol=0.03)
    np.testing.assert_allclose(eq.intercept, [X[:, 0].mean(), 0.5, -1.0], atol=0.05)
    np.testing.assert_array_equal(eq.order, [0, 1, 2])


def _learned_chain() -> StructuralEquations:
    """Learned form with identity MLPs and unit normalisations: the linear chain with weights 2, −0.5 in x itself."""
    zeros = np.zeros((3, 4))
    params = {"mean": np.zeros(3), "std": np.ones(3), "enc_w1": zeros + 1, "enc_b1": zeros, "enc_w2": zeros,
              "enc_b2": np.zeros(3), "feat_mean": np.zeros(3), "feat_scale": np.ones(3), "dec_w1": zeros + 1,
              "dec_b1": zeros, "dec_w2": zeros, "dec_b2": np.zeros(3)}
    return StructuralEquations("learned", source=[0, 1], target=[1, 2], weight=[2.0, -0.5], order=[0, 1, 2],
                               params=params)


def test_learned_form_with_identity_maps_propagates_a_chain():
    eq, X = _learned_chain(), _chain_data()
    predicted, _ = intervene(eq, X, {0: 0.0})
    np.testing.assert_allclose(predicted[:, 1] - X[:, 1], 2.0 * (0.0 - X[:, 0]))
    np.testing.assert_allclose(predicted[:, 2] - X[:, 2], -1.0 * (0.0 - X[:, 0]))


def test_elementwise_mlp_in_row_blocks_matches_the_model(monkeypatch):
    mlp = ElementwiseMLP(7, hidden=5, generator=torch.Generator().manual_seed(0)).double()
    with torch.no_grad():
        mlp.w2.mul_(20.0)  # nonlinear enough that a misaligned block would show
        mlp.b2.normal_()
    x = np.random.default_rng(0).normal(size=(53, 7))
    with torch.no_grad():
        expected = mlp(torch.as_tensor(x)).numpy()
    params = [t.detach().numpy() for t in (mlp.w1, mlp.b1, mlp.w2, mlp.b2)]
    whole = StructuralEquations._mlp(x, *params)
    monkeypatch.setattr(se, "MLP_BLOCK_ELEMENTS", 4 * 7 * 5)  # blocks of 4 rows, the last one short
    blocked = StructuralEquations._mlp(x, *params)
    np.testing.assert_allclose(whole, expected, rtol=1e-12, atol=1e-12)
    assert np.array_equal(blocked, whole)
    assert StructuralEquations._mlp(x[:0], *params).shape == (0, 7)


def test_encoder_moments_in_torch_blocks_match_the_numpy_mlp(monkeypatch):
    # learned_equations' feature normalisation runs through torch in blocks; it must be _mlp's function.
    mlp = ElementwiseMLP(7, hidden=5, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mlp.w2.mul_(20.0)
    rng = np.random.default_rng(1)
    X = sp.random(41, 7, density=0.5, random_state=1, format="csr") * 3.0
    mean, std = rng.normal(size=7), rng.uniform(0.5, 2.0, size=7)
    params = [t.detach().double().numpy() for t in (mlp.w1, mlp.b1, mlp.w2, mlp.b2)]
    h = StructuralEquations._mlp((X.toarray() - mean) / std, *params)
    monkeypatch.setitem(se.ENCODER_BLOCK_ELEMENTS, "cpu", 3 * 7 * 5)  # blocks of 3 rows, the last one short
    h_sum, h_sq = se._encoder_moments(mlp, mean, std, X, batch=10)
    np.testing.assert_allclose(h_sum, h.sum(0), rtol=1e-10)
    np.testing.assert_allclose(h_sq, (h * h).sum(0), rtol=1e-10)


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(0)
    n = 300
    a = rng.normal(size=n)
    b = np.tanh(1.5 * a) + 0.3 * rng.normal(size=n)
    c = 0.8 * b + 0.3 * rng.normal(size=n)
    d = rng.normal(size=n)  # unconnected
    e = -0.9 * d + 0.3 * rng.normal(size=n)
    X = np.column_stack([a, b, c, d, e])
    fit = fit_variational_notears(X.astype(np.float32), rank=None, epochs=40, seed=0, device="cpu")
    dag, _ = make_dag(fit.adjacency, 0.05)
    assert np.count_nonzero(dag) >= 1
    return X, learned_equations(fit.model, fit.mean, fit.std, X, dag)


def test_counterfactual_leaves_non_descendants_exactly_unchanged(fitted):
    X, eq = fitted
    for g in range(X.shape[1]):
        predicted, _ = intervene(eq, X, {g: float(X[:, g].mean() + 2.0)})
        untouched = ~eq.descendants([g])
        untouched[g] = False
        assert np.array_equal(predicted[:, untouched], X[:, untouched])
        assert np.all(predicted[:, g] == X[:, g].mean() + 2.0)


def test_counterfactual_do_observed_values_reproduces_the_data_exactly(fitted):
    X, eq = fitted
    predicted, _ = intervene(eq, X, {g: X[:, g] for g in range(X.shape[1])})
    assert np.array_equal(predicted, X)
    predicted, _ = intervene(eq, X, {int(eq.source[0]): X[:, int(eq.source[0])]})
    assert np.array_equal(predicted, X)


def test_interventional_without_effect_on_non_descendants(fitted):
    X, eq = fitted
    g = int(eq.source[0])
    predicted, reference = intervene(eq, X, {g: 0.0}, mode="interventional", n_cells=500, seed=0)
    untouched = ~eq.descendants([g])
    untouched[g] = False
    assert np.array_equal(predicted[:, untouched], reference[:, untouched])
    # without intervention the generated cells follow the data's means (decoder residuals drawn too)
    _, again = intervene(eq, X, {}, mode="interventional", n_cells=3000, seed=1)
    np.testing.assert_allclose(again.mean(0), X.mean(0), atol=0.15)


def test_counterfactual_subset_of_cells_is_seeded(fitted):
    X, eq = fitted
    p1, r1 = intervene(eq, X, {0: 1.0}, n_cells=50, seed=3)
    p2, r2 = intervene(eq, X, {0: 1.0}, n_cells=50, seed=3)
    assert p1.shape == (50, X.shape[1]) and np.array_equal(p1, p2) and np.array_equal(r1, r2)


def test_equations_survive_h5ad(fitted, tmp_path):
    X, eq = fitted
    holder = ad.AnnData(np.zeros((2, 2), dtype=np.float32))
    holder.uns["eq"] = eq.to_dict()
    holder.write_h5ad(tmp_path / "e.h5ad")
    back = StructuralEquations.from_dict(ad.read_h5ad(tmp_path / "e.h5ad").uns["eq"])
    assert np.array_equal(intervene(back, X, {0: 1.0})[0], intervene(eq, X, {0: 1.0})[0])
    lin = linear_equations(X, np.eye(X.shape[1], k=1))
    holder.uns["lin"] = lin.to_dict()
    holder.write_h5ad(tmp_path / "l.h5ad")
    back = StructuralEquations.from_dict(ad.read_h5ad(tmp_path / "l.h5ad").uns["lin"])
    np.testing.assert_array_equal(back.intercept, lin.intercept)


def test_cycle_and_bad_kind_are_refused():
    with pytest.raises(ValueError, match="cycle"):
        topological_order(3, np.array([0, 1, 2]), np.array([1, 2, 0]))
    with pytest.raises(ValueError, match="kind"):
        StructuralEquations("quadratic", [], [], [], [0])
    with pytest.raises(ValueError, match="mode"):
        intervene(_chain_linear(), _chain_data(), {0: 1.0}, mode="observational")
