"""Step I's nonlinear-parents model (cape.causal.parents_mlp): exact properties, a small fit, do() on it."""

from __future__ import annotations

import functools
import importlib

import anndata as ad
import numpy as np
import pytest
import torch

import cape
from cape._errors import CapeInputError
from cape.causal import (
    ParentsMLP,
    ParentsMLPConfig,
    StructuralEquations,
    fit_parents_mlp,
    intervene,
    is_dag,
    learned_equations,
    make_dag,
)
from cape.causal.parents_mlp import bounded_acyclicity, min_cells, profiled_gaussian_nll
from cape.causal.structural_equations import _generate

FAST = {"screen_steps": 1000, "steps": 1000, "batch_size": 256}


def _nonlinear_chain(n=1500, seed=0) -> np.ndarray:
    """a → b → c and a → c, saturating and quadratic effects."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=n)
    b = 2.0 * np.tanh(1.5 * a) + 0.4 * rng.normal(size=n)
    c = 1.5 * np.tanh(b) - 0.5 * a**2 + 0.4 * rng.normal(size=n)
    return np.column_stack([a, b, c])


def test_adjacency_is_the_norm_of_each_parents_weights_and_masked_entries_are_ignored():
    model = ParentsMLP(4, hidden=3, generator=torch.Generator().manual_seed(0))
    A = model.adjacency().detach()
    W = model.weight.detach()
    brute = torch.stack([torch.stack([W[j, i].norm() if i != j else torch.tensor(0.0) for j in range(4)])
                         for i in range(4)])
    torch.testing.assert_close(A, brute)
    candidates = torch.zeros(4, 4, dtype=torch.bool)
    candidates[0, 1] = candidates[2, 1] = True  # gene 1 reads genes 0 and 2 only
    model.restrict(candidates)
    A = model.adjacency().detach()
    assert (A[~candidates] == 0).all() and (A[candidates] > 0).all()
    x = torch.randn(5, 4)
    y = x.clone()
    y[:, 3] += 10.0  # gene 3 is nobody's candidate parent: no output moves
    torch.testing.assert_close(model(x), model(y))
    y[:, 0] += 1.0
    assert not torch.allclose(model(x)[:, 1], model(y)[:, 1])
    torch.testing.assert_close(model(x)[:, [0, 2, 3]], model(y)[:, [0, 2, 3]])  # constants: no parents


def test_profiled_likelihood_is_scale_invariant_up_to_a_constant():
    g = torch.Generator().manual_seed(1)
    x, pred = torch.randn(50, 3, generator=g), torch.randn(50, 3, generator=g)
    scale = torch.tensor([1.0, 7.0, 0.1])
    shifted = profiled_gaussian_nll(pred * scale, x * scale)
    torch.testing.assert_close(shifted, profiled_gaussian_nll(pred, x) + torch.log(scale).sum())
    brute = 0.5 * sum(np.log(np.mean((x[:, j] - pred[:, j]).numpy() ** 2)) for j in range(3))
    assert float(profiled_gaussian_nll(pred, x)) == pytest.approx(brute, rel=1e-5)


def test_bounded_acyclicity_is_h_below_its_limit_and_continuous_with_its_slope_above():
    h = torch.tensor([0.0, 1e-9, 3.0, 1e6], dtype=torch.float64, requires_grad=True)
    value = bounded_acyclicity(h)
    value.sum().backward()
    torch.testing.assert_close(value.detach(), h.detach())
    torch.testing.assert_close(h.grad, torch.ones(4, dtype=torch.float64))
    big = torch.tensor([1e6 * (1 + 1e-9), 1e22], dtype=torch.float64, requires_grad=True)
    bounded_acyclicity(big).sum().backward()
    assert float(bounded_acyclicity(big.detach())[0]) == pytest.approx(1e6, rel=1e-8)
    assert float(big.grad[0]) == pytest.approx(1.0, rel=1e-6) and float(big.grad[1]) == pytest.approx(1e6 / 1e22)


@pytest.fixture(scope="module")
def chain_fit():
    X = _nonlinear_chain()
    return X, fit_parents_mlp(X, seed=0, device="cpu", **FAST)


def test_fit_recovers_a_nonlinear_chain_as_a_dag_and_is_deterministic(chain_fit):
    X, fit = chain_fit
    dag, _ = make_dag(fit.adjacency, 0.2)
    assert is_dag(dag)
    found = {(int(i), int(j)) for i, j in zip(*np.nonzero(dag), strict=True)}
    skeleton = {frozenset(e) for e in found}
    assert {frozenset((0, 1)), frozenset((1, 2))} <= skeleton
    again = fit_parents_mlp(X, seed=0, device="cpu", **FAST)
    np.testing.assert_array_equal(fit.adjacency, again.adjacency)
    stage2 = np.asarray(fit.history["stage"]) == 2
    h = np.asarray(fit.history["h"])[stage2]
    assert np.isnan(np.asarray(fit.history["h"])[~stage2]).all() and h[-1] < h[0]
    assert fit.mean.shape == (3,) and np.all(fit.std > 0)


def test_fit_refuses_too_many_genes_and_too_few_cells():
    with pytest.raises(ValueError, match="at most"):
        fit_parents_mlp(np.zeros((5, cape.causal.parents_mlp.MAX_GENES + 1)), device="cpu")
    assert min_cells(5) == 40
    with pytest.raises(ValueError, match="needs at least 40 cells for 5 genes"):
        fit_parents_mlp(np.random.default_rng(0).normal(size=(39, 5)), device="cpu")


def test_counterfactual_on_the_fitted_equations_is_exact(chain_fit):
    X, fit = chain_fit
    dag, _ = make_dag(fit.adjacency, 0.2)
    eq = learned_equations(fit.model, fit.mean, fit.std, X, dag)
    assert eq.kind == "parents_mlp" and eq.params["edge_w1"].shape == (int((dag != 0).sum()), 10)
    root = int(eq.order[0])
    # do(observed) returns the data bit for bit; non-descendants never move
    predicted, _ = intervene(eq, X, {root: X[:, root]})
    assert np.array_equal(predicted, X)
    predicted, _ = intervene(eq, X, {root: 1.5})
    untouched = ~eq.descendants([root])
    untouched[root] = False
    assert np.array_equal(predicted[:, untouched], X[:, untouched])
    # brute force: regenerating every cell from its own abducted noise under the intervention gives the same cells
    noise = eq.abduct(X)
    values = {root: np.full(X.shape[0], 1.5)}
    np.testing.assert_allclose(predicted, _generate(eq, noise, eq.parents(), values, X.shape[0]), atol=1e-10)
    np.testing.assert_allclose(_generate(eq, noise, eq.parents(), {}, X.shape[0]), X, atol=1e-10)
    back = StructuralEquations.from_dict(eq.to_dict())
    assert np.array_equal(intervene(back, X, {root: 1.5})[0], predicted)


def test_tl_causal_graph_with_the_parents_mlp_model(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.import_module("cape.causal.pipeline"), "fit_parents_mlp",
                        functools.partial(fit_parents_mlp, **FAST))
    adata = ad.AnnData(_nonlinear_chain().astype(np.float32))
    adata.var_names = ["A", "B", "C"]
    cape.tl.causal_graph(adata, model="parents_mlp", use_genes=None, device="cpu", tau=0.2)
    record = adata.uns["cape"]["causal_graph"]
    assert record["params"]["model"] == "parents_mlp" and record["equations"]["kind"] == "parents_mlp"
    assert record["n_edges"] >= 2 and record["rank_used"] == "dense" and "rho_max" not in record
    adata.write_h5ad(tmp_path / "g.h5ad")
    back = ad.read_h5ad(tmp_path / "g.h5ad")
    equations = back.uns["cape"]["causal_graph"]["equations"]
    gene = back.var_names[int(equations["order"][0])]
    cape.tl.predict_intervention(back, {gene: "2x"}, key_added="up")
    reached = set(back.uns["up"]["descendants"])
    assert reached and all(back.var.loc[g, "up_shift"] != 0 for g in reached)
    np.testing.assert_allclose(back.var["up_shift"], back.layers["up"].mean(0) - back.X.mean(0), atol=1e-5)


def test_tl_refuses_unknown_model_and_too_many_genes():
    adata = ad.AnnData(np.random.default_rng(0).normal(size=(20, 3)).astype(np.float32))
    with pytest.raises(CapeInputError, match="model must be one of"):
        cape.tl.causal_graph(adata, model="gnn", use_genes=None)
    wide = ad.AnnData(np.random.default_rng(0).normal(size=(20, cape.causal.parents_mlp.MAX_GENES + 1))
                      .astype(np.float32))
    with pytest.raises(CapeInputError, match="at most"):
        cape.tl.causal_graph(wide, model="parents_mlp", use_genes=None)
    few = ad.AnnData(np.random.default_rng(0).normal(size=(25, 6)).astype(np.float32))
    with pytest.raises(CapeInputError, match="needs at least 50 cells for 6 genes .* use at most 3 genes"):
        cape.tl.causal_graph(few, model="parents_mlp", use_genes=None)


@pytest.mark.parametrize("options, words", [({"hidden": 0}, "hidden must be a positive integer"),
                                            ({"steps": -1}, "steps must be a whole number"),
                                            ({"l2": float("nan")}, "l2 must be a finite number"),
                                            ({"lr": 0.0}, "lr must be > 0"),
                                            ({"step": 10}, "did you mean 'steps'")])
def test_options_are_validated_in_one_line(options, words):
    with pytest.raises(CapeInputError, match=words):
        fit_parents_mlp(np.zeros((50, 3)), device="cpu", **options)


def test_config_object_and_keywords_are_the_same_fit():
    X = np.random.default_rng(1).normal(size=(80, 4))
    by_object = fit_parents_mlp(X, ParentsMLPConfig(screen_steps=20, steps=20, batch_size=32), device="cpu")
    by_name = fit_parents_mlp(X, screen_steps=20, steps=20, batch_size=32, device="cpu")
    np.testing.assert_array_equal(by_object.adjacency, by_name.adjacency)
