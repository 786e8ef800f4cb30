"""VariationalNotears and its trainer: Woodbury decoder, ELBO terms, determinism, sparse streaming, DAG output."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cape.causal import VariationalNotears, fit_variational_notears, gene_moments, is_dag, make_dag
from cape.causal.trainer import RHO_MAX_DENSE, RHO_MAX_LOW_RANK, SPARSE_MIN_GENES, resolve_rho_max


@pytest.mark.parametrize("rank", [None, 3])
def test_propagate_inverts_i_minus_a(rank: int | None) -> None:
    torch.manual_seed(0)
    model = VariationalNotears(8, rank=rank, seed=1).double()
    with torch.no_grad():
        for p in model.adjacency_parameters():
            p.normal_(0, 0.2)
    z = torch.randn(5, 8, dtype=torch.float64)
    A = model.adjacency().detach()
    expected = z @ torch.linalg.inv(torch.eye(8, dtype=torch.float64) - A)
    torch.testing.assert_close(model.propagate(z), expected, rtol=1e-9, atol=1e-10)


def test_dense_adjacency_has_zero_diagonal_and_low_rank_is_uv() -> None:
    dense = VariationalNotears(5, rank=None)
    with torch.no_grad():
        dense.weight.fill_(0.3)
    assert torch.all(dense.adjacency().diagonal() == 0)
    low = VariationalNotears(6, rank=2)
    full = low.U @ low.V.T
    torch.testing.assert_close(low.adjacency(), full - torch.diag(full.diagonal()))
    torch.testing.assert_close(low.self_loops(), full.diagonal())
    assert torch.all(low.adjacency().diagonal() == 0)
    with pytest.raises(ValueError):
        VariationalNotears(4, rank=4)


def test_elbo_terms_without_sampling() -> None:
    model = VariationalNotears(4, rank=None, seed=0).eval()
    x = torch.randn(16, 4)
    out = model(x)
    mu = model.encode(x)
    torch.testing.assert_close(out["kl"], 0.5 * mu.pow(2).sum(1).mean())
    torch.testing.assert_close(out["recon"], 0.5 * (x - model.decode(mu)).pow(2).sum(1).mean())
    sampled = VariationalNotears(4, rank=None, seed=0, sample_latent=True)
    assert isinstance(sampled.z_logvar, torch.nn.Parameter)
    assert torch.isfinite(sampled(x)["nelbo"])


def test_gene_moments_sparse_equals_dense() -> None:
    rng = np.random.default_rng(0)
    X = rng.poisson(0.5, size=(50, 7)).astype(np.float32)
    m1, s1 = gene_moments(X)
    m2, s2 = gene_moments(sp.csr_matrix(X))
    np.testing.assert_allclose(m1, X.mean(0), rtol=1e-6)
    np.testing.assert_allclose(s1, X.std(0), rtol=1e-5)
    np.testing.assert_allclose(m1, m2, rtol=1e-6)
    np.testing.assert_allclose(s1, s2, rtol=1e-5)


def _data(n: int, m: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, m))
    X[:, 1] += 1.5 * X[:, 0]
    if m > 2:
        X[:, 2] += np.tanh(X[:, 1])
    return X.astype(np.float32)


def test_training_is_deterministic_and_sparse_streaming_matches_dense() -> None:
    X = _data(60, 5, 0)
    X[X < 0] = 0.0  # sparse-looking
    kw = {"rank": 2, "epochs": 3, "batch_size": 16, "device": "cpu", "seed": 7}
    a = fit_variational_notears(X, **kw)
    b = fit_variational_notears(X, **kw)
    c = fit_variational_notears(sp.csr_matrix(X), **kw)
    np.testing.assert_array_equal(a.adjacency, b.adjacency)
    np.testing.assert_allclose(a.adjacency, c.adjacency, rtol=1e-5, atol=1e-6)
    assert a.epochs_run == 3 and len(a.history["h"]) == 3
    assert np.all(np.diag(a.adjacency) == 0)
    d = fit_variational_notears(X, **{**kw, "seed": 8})
    assert not np.array_equal(a.adjacency, d.adjacency)


def test_h_every_resolution() -> None:
    from cape.causal.trainer import (
        AUTO_H_EVERY,
        AUTO_H_EVERY_LARGE,
        AUTO_H_EVERY_LARGE_M,
        EXACT_ACYCLICITY_MAX,
        resolve_h_every,
    )

    assert resolve_h_every(None, EXACT_ACYCLICITY_MAX, None) == 1
    assert resolve_h_every(None, EXACT_ACYCLICITY_MAX + 1, None) == AUTO_H_EVERY
    assert resolve_h_every(None, 1000, 20) == 1  # k = 210: the exact k×k exponential is cheap
    assert resolve_h_every(None, 1000, 40) == AUTO_H_EVERY  # k = 820
    assert resolve_h_every(None, AUTO_H_EVERY_LARGE_M + 1, 40) == AUTO_H_EVERY_LARGE
    assert resolve_h_every(3, 1000, 40) == 3
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="h_every must be a whole number"):
            resolve_h_every(bad, 10, None)


@pytest.mark.parametrize("rank", [None, 2])
def test_linearised_acyclicity_steps_train_and_find_the_same_pair(rank: int | None) -> None:
    X = _data(400, 6, 3)
    X[:, 2] = np.random.default_rng(5).normal(size=400)
    kw = dict(rank=rank, epochs=15, batch_size=64, device="cpu", seed=0)
    exact = fit_variational_notears(X, h_every=1, **kw)
    lagged = fit_variational_notears(X, h_every=4, **kw)
    assert exact.h_every == 1 and lagged.h_every == 4
    assert np.all(np.isfinite(lagged.adjacency)) and all(np.isfinite(lagged.history["h"]))
    top = [set(np.unravel_index(np.argmax(np.abs(f.adjacency)), f.adjacency.shape)) for f in (exact, lagged)]
    assert top[0] == top[1]
    assert not np.array_equal(exact.adjacency, lagged.adjacency)  # the linearised steps did run
    with pytest.raises(ValueError, match="h_every must be a whole number"):
        fit_variational_notears(_data(40, 4, 1), rank=None, epochs=1, device="cpu", h_every=0)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), m=st.integers(2, 6), rank=st.sampled_from([None, 1, 2]),
       tau=st.floats(0.0, 0.9))
def test_trained_graph_is_always_acyclic(seed: int, m: int, rank: int | None, tau: float) -> None:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(30, m)).astype(np.float32) @ rng.normal(size=(m, m)).astype(np.float32)
    if rank is not None and rank >= m:
        rank = None
    fit = fit_variational_notears(X, rank=rank, epochs=2, batch_size=10, device="cpu", seed=seed)
    dag, removed = make_dag(fit.adjacency, tau)
    assert is_dag(dag) and removed >= 0


def test_recovers_a_strong_edge_direction_free_signal() -> None:
    # A strongly coupled pair among independent genes: the learnt |A| is largest on that pair.
    X = _data(400, 4, 3)
    X[:, 2] = np.random.default_rng(5).normal(size=400)  # decouple gene 2
    fit = fit_variational_notears(X, rank=None, epochs=15, batch_size=64, device="cpu", seed=0)
    W = np.abs(fit.adjacency)
    strongest = np.unravel_index(np.argmax(W), W.shape)
    assert set(strongest) == {0, 1}


def test_chunked_elementwise_mlp_equals_one_block() -> None:
    from cape.causal import ElementwiseMLP

    mlp = ElementwiseMLP(37, 8, torch.Generator().manual_seed(0))
    x = torch.randn(5, 37)
    whole = mlp(x)
    mlp.chunk_elements = 5 * 8 * 4  # 4 genes per chunk
    torch.testing.assert_close(mlp(x), whole)
    torch.testing.assert_close(mlp(x)[:, 3], x[:, 3] + mlp._block(x[:, 3:4], slice(3, 4))[:, 0] + mlp.b2[3])


def test_batches_never_hold_a_single_cell() -> None:
    # 33 cells with batch size 32 would leave a last batch of one cell.
    fit = fit_variational_notears(_data(33, 3, 2), rank=None, epochs=1, batch_size=32, device="cpu")
    assert np.all(np.isfinite(fit.adjacency))


# --- the low-rank SEM masks its diagonal (A = UVᵀ − diag(UVᵀ)) ---------------------------------------------
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), m=st.integers(3, 9), rank=st.integers(1, 2), scale=st.floats(0.05, 0.6))
def test_masked_woodbury_equals_dense_solve(seed: int, m: int, rank: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    model = VariationalNotears(m, rank=rank, seed=seed).double()
    with torch.no_grad():
        model.U.copy_(torch.randn(m, rank, generator=gen, dtype=torch.float64) * scale)
        model.V.copy_(torch.randn(m, rank, generator=gen, dtype=torch.float64) * scale)
    full = model.U.detach() @ model.V.detach().T
    masked = full - torch.diag(full.diagonal())
    eye = torch.eye(m, dtype=torch.float64)
    z = torch.randn(4, m, generator=gen, dtype=torch.float64)
    # Woodbury with the diagonal base B = I + diag(UVᵀ) against a dense solve with the masked A.
    expected = torch.linalg.solve((eye - masked).T, z.T).T
    torch.testing.assert_close(model.propagate(z), expected, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(model.adjacency().detach(), masked, rtol=0, atol=0)
    # The encoder uses the same masked A: μ = f(X)(I − A).
    model.eval()
    x = torch.randn(6, m, generator=gen, dtype=torch.float64)
    fx = model.feature_norm(model.encoder_mlp(x)) * model.feature_scale
    torch.testing.assert_close(model.encode(x), fx @ (eye - masked), rtol=1e-9, atol=1e-10)


def test_sem_does_not_see_the_low_rank_diagonal() -> None:
    # UVᵀ = 0.25·e₀e₀ᵀ is a pure self-loop: the masked A is 0, so the SEM (−ELBO, its U/V gradients from the
    # data term) is exactly that of A = 0, while the acyclicity penalty, which counts the self-loop, is > 0.
    model = VariationalNotears(6, rank=2, seed=3).double().eval()
    x = torch.randn(16, 6, dtype=torch.float64)
    with torch.no_grad():
        model.U.zero_()
        model.V.zero_()
    reference = model(x)["nelbo"].detach()
    with torch.no_grad():
        model.U[0, 0] = model.V[0, 0] = 0.5
    assert torch.all(model.adjacency() == 0)
    torch.testing.assert_close(model(x)["nelbo"], reference, rtol=1e-12, atol=1e-12)
    assert float(model.acyclicity().detach()) > 0.06


def test_l1_is_the_norm_of_the_masked_adjacency() -> None:
    model = VariationalNotears(5, rank=2, seed=0)
    torch.testing.assert_close(model.l1(), model.adjacency().abs().sum())
    dense = VariationalNotears(5, rank=None, seed=0)
    with torch.no_grad():
        dense.weight.fill_(-0.5)
    torch.testing.assert_close(dense.l1(), torch.tensor(0.5 * 20))


def test_feature_scale_sets_the_per_gene_scale_of_f() -> None:
    model = VariationalNotears(3, rank=None, seed=0, feature_norm="data")
    model.set_feature_scale(torch.tensor([1.0, 2.0, 5.0]))
    fx = model.feature_norm(model.encoder_mlp(torch.randn(500, 3))) * model.feature_scale
    torch.testing.assert_close(fx.std(0, unbiased=False), torch.tensor([1.0, 2.0, 5.0]), rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError):
        VariationalNotears(3, feature_norm="bogus")


def test_raw_scale_fit_keeps_the_genes_relative_scales() -> None:
    X = _data(64, 3, 4) * np.array([1.0, 3.0, 0.5], dtype=np.float32)
    captured = {}
    import cape.causal.trainer as trainer

    class Spy(VariationalNotears):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            captured["model"] = self

    original = trainer.VariationalNotears
    trainer.VariationalNotears = Spy
    try:
        fit_variational_notears(X, rank=None, epochs=1, batch_size=32, device="cpu", standardize="none",
                                feature_norm="data")
    finally:
        trainer.VariationalNotears = original
    np.testing.assert_allclose(captured["model"].feature_scale.numpy(), X.std(0), rtol=1e-4)


def test_dual_steps_wait_for_enough_adam_steps() -> None:
    X = _data(64, 3, 0)  # 4 steps per epoch at batch 16
    kw = {"rank": None, "epochs": 12, "batch_size": 16, "device": "cpu", "min_epochs": 100, "dual_every": 5}
    patient = fit_variational_notears(X, dual_steps=40, **kw)  # dual steps after epochs 10 only
    eager = fit_variational_notears(X, dual_steps=1, **kw)  # after epochs 5 and 10
    assert patient.history["alpha"][:10] == [0.0] * 9 + [patient.history["alpha"][9]]
    assert patient.history["alpha"][8] == 0.0 and patient.history["alpha"][9] > 0
    assert eager.history["alpha"][4] > 0 and eager.history["alpha"][3] == 0.0



def test_rho_stops_growing_at_rho_max() -> None:
    X = _data(64, 3, 0)
    fit = fit_variational_notears(X, rank=None, epochs=30, batch_size=16, device="cpu", min_epochs=100,
                                  dual_every=1, dual_steps=1, rho_max=100.0)
    rho = fit.history["rho"]
    assert max(rho) == 100.0 and rho[-1] == 100.0 and rho == sorted(rho)
    assert fit.rho_max == 100.0


def test_rho_max_default_follows_the_parameterisation_of_a() -> None:
    from cape.causal import NotearsConfig

    assert NotearsConfig().rho_max is None
    assert resolve_rho_max(None, None) == RHO_MAX_DENSE == 1e8
    assert resolve_rho_max(None, 40) == RHO_MAX_LOW_RANK == 1e4
    # A dense A beyond SPARSE_MIN_GENES takes the low-rank cap (the dual steps' α would otherwise crush its weights).
    assert resolve_rho_max(None, None, SPARSE_MIN_GENES) == RHO_MAX_DENSE
    assert resolve_rho_max(None, None, SPARSE_MIN_GENES + 1) == RHO_MAX_LOW_RANK
    assert resolve_rho_max(1e6, None, SPARSE_MIN_GENES + 1) == 1e6
    assert resolve_rho_max(3.0, 40) == 3.0
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="rho_max"):
            resolve_rho_max(bad, None)
    X = _data(64, 6, 0)
    # Dual steps after every epoch: ρ grows tenfold per epoch until the cap of the parameterisation.
    kw = {"epochs": 12, "batch_size": 16, "device": "cpu", "min_epochs": 100, "dual_every": 1, "dual_steps": 1}
    low = fit_variational_notears(X, rank=2, **kw)
    assert low.rho_max == 1e4 and max(low.history["rho"]) <= 1e4
    dense = fit_variational_notears(X, rank=None, **kw)
    assert dense.rho_max == 1e8 and max(dense.history["rho"]) > 1e4


def test_hidden_zero_is_the_linear_sem() -> None:
    torch.manual_seed(0)
    model = VariationalNotears(4, rank=None, hidden=0).eval()
    with torch.no_grad():
        model.weight.copy_(torch.randn(4, 4))
        model.encoder_mlp.b2.copy_(torch.randn(4))
    x = torch.randn(32, 4)
    fx = model.feature_norm(x + model.encoder_mlp.b2)
    with torch.no_grad():
        torch.testing.assert_close(model.encode(x), fx - fx @ model.adjacency())
        torch.testing.assert_close(model.decoder_mlp(x), x + model.decoder_mlp.b2)


@pytest.mark.slow
def test_linear_sem_on_the_raw_scale_recovers_the_least_squares_weights() -> None:
    """hidden=0, raw scale: cape's objective is NOTEARS' (½‖X − XW‖²/n + 0.1‖W‖₁ on centred data).

    Chain x0 → x1 → x2 with weights 1.5 and −0.8 and unit noise, paper defaults otherwise (100 epochs,
    batch 128, lr 3e-3; 40 epochs leave the weights still growing): both edges within 0.15 of the truth
    (the L1 shrinks them a little), in the right direction, every other weight below τ. ~30 s.
    """
    rng = np.random.default_rng(3)
    n = 3000
    x0 = rng.normal(size=n)
    x1 = 1.5 * x0 + rng.normal(size=n)
    x2 = -0.8 * x1 + rng.normal(size=n)
    X = np.column_stack([x0, x1, x2]).astype(np.float32)
    fit = fit_variational_notears(X, rank=None, hidden=0, epochs=100, device="cpu", seed=0, standardize="none",
                                  feature_norm="data")
    A = fit.adjacency
    assert abs(A[0, 1] - 1.5) < 0.15 and abs(A[1, 2] + 0.8) < 0.15, A
    assert np.abs(A[[1, 2, 2, 0], [0, 1, 0, 2]]).max() < 0.2, A


# --- compiled per-gene MLPs ------------------------------------------------------------------------------------
def test_fused_mlp_expression_equals_the_chunked_module() -> None:
    from cape.causal.model import ElementwiseMLP, _elementwise_mlp

    mlp = ElementwiseMLP(11, 8, torch.Generator().manual_seed(1))
    with torch.no_grad():
        mlp.w2.normal_()
        mlp.b2.normal_()
    x = torch.randn(7, 11)
    torch.testing.assert_close(_elementwise_mlp(x, mlp.w1, mlp.b1, mlp.w2, mlp.b2), mlp(x), rtol=1e-5, atol=1e-5)


def test_mlps_compile_by_default_on_cpu_only_for_fits_worth_the_compiling() -> None:
    from cape.causal import NotearsConfig
    from cape.causal.trainer import COMPILE_MIN_WORK, compiles_by_default

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    config = NotearsConfig()  # 100 epochs, 64 hidden units
    # 3,000 cells × 300 genes compile; pbmc68k_reduced's 700 × 300 do not (a cold compile costs more than it saves)
    assert compiles_by_default(config, 3000, 300, cpu)
    assert not compiles_by_default(config, 700, 300, cpu)
    assert not compiles_by_default(config, 200, 20, cpu)
    assert not compiles_by_default(config, 3000, 300, cuda)  # CUDA replays whole steps as graphs instead
    # the rule is the work, not the batch: a one-epoch fit of the same matrix is not worth it
    assert not compiles_by_default(NotearsConfig(epochs=1), 3000, 300, cpu)
    per_cell = config.epochs * 300 * config.hidden
    cells = -(-COMPILE_MIN_WORK // per_cell)
    assert compiles_by_default(config, cells, 300, cpu) and not compiles_by_default(config, cells - 1, 300, cpu)


def test_compile_failure_falls_back_to_eager(monkeypatch, caplog) -> None:
    import cape.causal.model as model_module
    from cape.causal.trainer import _enable_compiled_mlps

    def broken():
        def fail(*args):
            raise RuntimeError("no compiler here")
        return fail

    monkeypatch.setattr(model_module, "compiled_elementwise_mlp", broken)
    model = VariationalNotears(4, rank=None, seed=0)
    with caplog.at_level("WARNING", logger="cape"):
        assert not _enable_compiled_mlps(model, torch.randn(8, 4))
    assert "no compiler here" in caplog.text
    assert not model.encoder_mlp.compiled and not model.decoder_mlp.compiled
    fit = fit_variational_notears(_data(32, 4, 0), rank=None, epochs=1, batch_size=16, device="cpu",
                                  compile_mlp=True)
    assert not fit.compiled_mlp and np.all(np.isfinite(fit.adjacency))


@pytest.mark.slow
def test_compiled_mlp_matches_eager_values_and_gradients() -> None:
    from cape.causal import ElementwiseMLP

    mlp = ElementwiseMLP(9, 8, torch.Generator().manual_seed(2))
    x = torch.randn(6, 9, requires_grad=True)
    eager = mlp(x)
    grads = torch.autograd.grad(eager.square().sum(), [x, *mlp.parameters()])
    mlp.compiled = True
    compiled = mlp(x)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    for a, b in zip(torch.autograd.grad(compiled.square().sum(), [x, *mlp.parameters()]), grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_compiled_mlp_serves_many_gene_counts_without_recompiling() -> None:
    from torch._dynamo.utils import counters

    from cape.causal import ElementwiseMLP

    before = counters["stats"]["unique_graphs"]
    for genes in (5, 9, 13, 17, 21):  # as a trainer meets them: two batch sizes, inputs with and without grad
        gen = torch.Generator().manual_seed(genes)
        mlp = ElementwiseMLP(genes, 4, gen)  # nn.Parameters, whose shapes torch.compile would hold static
        mlp.compiled = True
        for batch in (6, 7):
            for grad in (False, True):
                mlp(torch.randn(batch, genes, generator=gen, requires_grad=grad)).sum().backward()
    # Shape-specialised compiling made a graph per gene count and grad mode here (and hit torch's limit of 8 in a
    # scaling run, after which the MLPs ran eagerly, 2-3× slower); one dynamic graph per grad mode is enough.
    assert counters["stats"]["unique_graphs"] - before <= 3


def test_reconstruction_on_a_subsample_is_an_unbiased_estimate_and_leaves_the_kl_alone() -> None:
    torch.manual_seed(0)
    model = VariationalNotears(6, rank=None, hidden=4, seed=0).eval()
    x = torch.randn(40, 6)
    with torch.no_grad():
        full = model(x)
        subs = [model(x, recon_rows=10) for _ in range(400)]
    assert all(float(s["kl"]) == pytest.approx(float(full["kl"])) for s in subs)
    mean_recon = float(torch.stack([s["recon"] for s in subs]).mean())
    assert mean_recon == pytest.approx(float(full["recon"]), rel=0.05)
    assert len({round(float(s["recon"]), 6) for s in subs}) > 1  # the subsample is drawn anew


def test_recon_fraction_is_automatic_at_scale_and_validated() -> None:
    X = np.random.default_rng(0).normal(size=(64, 5)).astype(np.float32)
    with pytest.raises(ValueError, match="recon_fraction"):
        fit_variational_notears(X, rank=None, epochs=1, device="cpu", recon_fraction=0.0)
    quarter = fit_variational_notears(X, rank=None, epochs=2, device="cpu", recon_fraction=0.25)
    assert np.isfinite(quarter.adjacency).all()


def test_the_fit_flushes_denormals_and_restores_the_default_afterwards(monkeypatch) -> None:
    tiny = 1e-40  # below float32's smallest normal number
    seen = []
    original = VariationalNotears.acyclicity

    def spy(self):
        seen.append(float(torch.tensor(tiny, dtype=torch.float32) * 1.0))
        return original(self)

    monkeypatch.setattr(VariationalNotears, "acyclicity", spy)
    X = np.random.default_rng(0).normal(size=(64, 5)).astype(np.float32)
    fit_variational_notears(X, rank=None, epochs=1, device="cpu")
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush denormals")
    assert seen and all(v == 0.0 for v in seen)  # flushed during the fit
    assert float(torch.tensor(tiny, dtype=torch.float32) * 1.0) > 0  # and not after it


def _sparse_and_masked(m: int = 9, seed: int = 0) -> tuple[VariationalNotears, VariationalNotears, np.ndarray]:
    """The same candidate-restricted A stored densely (masked) and as its candidate weights, in float64."""
    rng = np.random.default_rng(seed)
    candidates = rng.random((m, m)) < 0.4
    masked = VariationalNotears(m, rank=None, seed=1, candidates=candidates).double()
    sparse = VariationalNotears(m, rank=None, seed=1, candidates=candidates, sparse=True).double()
    with torch.no_grad():
        weights = torch.as_tensor(rng.normal(0.0, 0.3, size=(m, m)))
        masked.weight.copy_(weights)
        sparse.edge_weight.copy_(weights[sparse.edge_index()])
    return masked, sparse, candidates


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sparse_adjacency_is_the_masked_dense_model(seed: int) -> None:
    masked, sparse, candidates = _sparse_and_masked(seed=seed)
    allowed = candidates & ~np.eye(9, dtype=bool)
    assert sparse.edge_weight.numel() == allowed.sum()
    torch.testing.assert_close(sparse.adjacency(), masked.adjacency())
    assert torch.all(masked.adjacency()[torch.as_tensor(~allowed)] == 0)
    x = torch.randn(24, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    totals = []
    for model in (masked, sparse):
        model.eval()
        terms = model(x)
        total = terms["nelbo"] + model.l1() + model.acyclicity()
        total.backward()
        totals.append((terms, total))
    for key in ("recon", "kl", "nelbo"):
        torch.testing.assert_close(totals[0][0][key], totals[1][0][key], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(masked.weight.grad[sparse.edge_index()], sparse.edge_weight.grad,
                               rtol=1e-10, atol=1e-12)
    # Only a sampled Z needs (I − A)⁻¹; the sparse model solves it exactly as the dense one does.
    z = torch.randn(5, 9, dtype=torch.float64)
    torch.testing.assert_close(sparse.propagate(z), masked.propagate(z))


def test_sparse_model_needs_candidates_and_a_dense_a() -> None:
    with pytest.raises(ValueError, match="pass candidates"):
        VariationalNotears(5, sparse=True)
    with pytest.raises(ValueError, match="dense A only"):
        VariationalNotears(5, rank=2, candidates=np.ones((5, 5), dtype=bool))
    with pytest.raises(ValueError, match="genes × genes"):
        VariationalNotears(5, candidates=np.ones((4, 4), dtype=bool), sparse=True)


def test_linearised_acyclicity_on_the_entries_of_a_sparse_a() -> None:
    from cape.causal.acyclicity_penalty import LinearisedAcyclicity

    _, sparse, _ = _sparse_and_masked(m=10, seed=3)
    with torch.no_grad():
        full = LinearisedAcyclicity(sparse.adjacency())
        on_entries = LinearisedAcyclicity(sparse.adjacency(), entries=sparse.edge_index())
        sparse.edge_weight.mul_(0.7)  # a later A, zero off the candidates as before
    values = sparse.edge_weight.detach().clone().requires_grad_()
    dense = sparse.adjacency().detach().clone().requires_grad_()
    h_entries, h_full = on_entries(values), full(dense)
    torch.testing.assert_close(h_entries, h_full, rtol=1e-10, atol=1e-12)
    h_entries.backward()
    h_full.backward()
    torch.testing.assert_close(values.grad, dense.grad[sparse.edge_index()])
    with pytest.raises(ValueError, match="linearised at a matrix of shape"):
        on_entries(dense)


def test_sparse_fit_follows_the_masked_dense_fit() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 8))
    X[:, 1] += X[:, 0]
    X[:, 2] += 0.8 * X[:, 1]
    candidates = np.zeros((8, 8), dtype=bool)
    candidates[[0, 1, 1, 2, 3], [1, 0, 2, 1, 4]] = True
    fits = [fit_variational_notears(X.astype(np.float32), rank=None, epochs=8, device="cpu", seed=0,
                                    candidates=candidates, sparse=sparse, h_every=h_every)
            for sparse in (False, True) for h_every in (1, 3)]
    assert not fits[0].sparse and fits[2].sparse
    for dense_fit, sparse_fit in ((fits[0], fits[2]), (fits[1], fits[3])):
        np.testing.assert_allclose(sparse_fit.adjacency, dense_fit.adjacency, atol=1e-5)
        assert np.all(sparse_fit.adjacency[~candidates] == 0)
    assert abs(fits[2].adjacency[0, 1]) + abs(fits[2].adjacency[1, 0]) > 0.1


@pytest.mark.parametrize("sparse_input", [False, True])
def test_rows_resident_on_the_device_give_the_same_fit(monkeypatch, sparse_input: bool) -> None:
    # CUDA keeps the standardised matrix and the intervention mask on the device where they fit; forced on here (the
    # CPU), that path must give the fit of the per-batch slicing bit for bit, interventions included.
    from cape.causal import trainer

    X = _data(90, 6, 2)
    X[X < 0] = 0.0
    X = sp.csr_matrix(X) if sparse_input else X
    intervened = np.zeros((90, 6), dtype=bool)
    intervened[:20, 1] = intervened[20:30, 4] = True
    kw = {"rank": None, "epochs": 3, "batch_size": 16, "device": "cpu", "seed": 3, "intervened": intervened}
    sliced = fit_variational_notears(X, **kw)
    monkeypatch.setattr(trainer, "_fits_on_device", lambda dev, n_bytes: True)
    resident = fit_variational_notears(X, **kw)
    np.testing.assert_array_equal(sliced.adjacency, resident.adjacency)
    assert sliced.history["loss"] == resident.history["loss"]
    # the data resident and the mask, checked after it, not
    fits = iter([True, False])
    monkeypatch.setattr(trainer, "_fits_on_device", lambda dev, n_bytes: next(fits))
    np.testing.assert_array_equal(fit_variational_notears(X, **kw).adjacency, sliced.adjacency)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fit_finds_the_cpu_graph() -> None:
    # Float32 kernels differ between the devices, so the weights differ by rounding; the strong edges must not.
    X = _data(400, 8, 4)
    kw = {"rank": None, "epochs": 20, "batch_size": 64, "seed": 0}
    cpu = fit_variational_notears(X, device="cpu", **kw)
    cuda = fit_variational_notears(X, device="cuda", **kw)
    assert cuda.device.startswith("cuda")
    a, b = np.abs(cpu.adjacency), np.abs(cuda.adjacency)
    assert (a > 0.2).any()
    assert not ((a > 0.2) & (b < 0.05)).any() and not ((b > 0.2) & (a < 0.05)).any()


def test_linearised_penalty_moves_in_place() -> None:
    # A captured CUDA graph reads the linearisation's tensors: assign_ must move the point without new tensors.
    from cape.causal.acyclicity_penalty import LinearisedAcyclicity

    gen = torch.Generator().manual_seed(0)
    A1, A2, A = (0.3 * torch.randn(6, 6, generator=gen) for _ in range(3))
    old = LinearisedAcyclicity(A1)
    pointers = [t.data_ptr() for t in (old.h0, old.A0, old.weights)]
    fresh = LinearisedAcyclicity(A2)
    old.assign_(fresh)
    assert [t.data_ptr() for t in (old.h0, old.A0, old.weights)] == pointers
    assert float(old(A)) == pytest.approx(float(fresh(A)), rel=1e-12)


def test_cuda_graphs_are_off_on_the_cpu_and_validated() -> None:
    from cape._errors import CapeInputError
    from cape.causal import NotearsConfig

    fit = fit_variational_notears(_data(60, 5, 1), rank=None, epochs=2, device="cpu", cuda_graphs=True)
    assert fit.cuda_graphs is False  # needs CUDA: the fit runs kernel by kernel
    with pytest.raises(CapeInputError, match="cuda_graphs must be True, False or None"):
        NotearsConfig(cuda_graphs="yes")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n_genes", [300, 1200])  # dense screened A (h_every 10); stored candidates (h_every 40)
def test_cuda_graph_steps_give_the_kernel_by_kernel_fit(n_genes: int) -> None:
    # Replayed steps run the same kernels on the same batches; only the reconstruction subsample's random rows and
    # atomics' order differ, so the strong weights agree.
    X = _data(1500, n_genes, 5)
    candidates = np.abs(np.corrcoef(X.T)) > 0.05
    kw = {"rank": None, "epochs": 6, "batch_size": 128, "seed": 0, "device": "cuda", "candidates": candidates}
    graphs = fit_variational_notears(X, **kw)
    eager = fit_variational_notears(X, cuda_graphs=False, **kw)
    assert graphs.cuda_graphs and not eager.cuda_graphs
    a, b = np.abs(graphs.adjacency), np.abs(eager.adjacency)
    assert (b > 0.1).any()
    assert not ((a > 0.1) & (b < 0.02)).any() and not ((b > 0.1) & (a < 0.02)).any()
    np.testing.assert_allclose(graphs.history["loss"], eager.history["loss"], rtol=1e-2)


def test_max_steps_cuts_the_epochs_of_a_fit_on_many_cells_and_genes() -> None:
    from cape.causal import MAX_GENE_STEPS, NotearsConfig, planned_epochs
    from cape.causal.trainer import step_limit

    config = NotearsConfig(epochs=100, batch_size=128, max_steps=2500)
    assert planned_epochs(config, 700, 50) == 100  # 6 batches × 100 epochs: under the cap
    assert planned_epochs(config, 10_000, 50) == 32  # 79 batches per epoch: ⌈2,500 / 79⌉
    assert planned_epochs(NotearsConfig(epochs=100, max_steps=None), 10_000, 2000) == 100
    assert planned_epochs(NotearsConfig(epochs=5, max_steps=1), 10_000, 2000) == 1
    auto = NotearsConfig(epochs=100, batch_size=128)
    assert auto.max_steps == "auto" and step_limit("auto", 2000) == MAX_GENE_STEPS // 2000 == 2500
    assert planned_epochs(auto, 10_000, 2000) == 32  # the cap binds on many genes and cells ...
    assert planned_epochs(auto, 10_000, 11) == 100  # ... not on a small panel (Sachs: 11 proteins)
    assert planned_epochs(auto, 700, 2000) == 100  # ... nor on few cells
    # ... and never below the stop rule's minimum: 10,000 genes × 50,000 cells allow 500 steps, 2 epochs of 391
    assert planned_epochs(auto, 50_000, 10_000) == auto.min_epochs == 10
    assert planned_epochs(NotearsConfig(epochs=5), 50_000, 10_000) == 5  # not above the epochs asked for either
    assert planned_epochs(NotearsConfig(max_steps=500), 50_000, 10_000) == 2  # a number of steps is taken as given
    X = np.random.default_rng(0).normal(size=(300, 4)).astype(np.float32)  # 3 batches of ≤ 128 cells
    fit = fit_variational_notears(X, epochs=10, max_steps=7, min_epochs=10, rank=None, device="cpu")
    assert fit.epochs_run == 3 and len(fit.history["loss"]) == 3  # ⌈7 / 3⌉ epochs, the last one whole
    assert fit_variational_notears(X, epochs=4, max_steps=None, min_epochs=10, rank=None,
                                   device="cpu").epochs_run == 4
