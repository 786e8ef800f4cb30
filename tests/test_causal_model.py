"""VariationalNotears and its trainer: Woodbury decoder, ELBO terms, determinism, sparse streaming, DAG output."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cape.causal import VariationalNotears, fit_variational_notears, gene_moments, is_dag, make_dag


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
    torch.testing.assert_close(low.adjacency(), low.U @ low.V.T)
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


def test_lagged_acyclicity_gradient_runs() -> None:
    fit = fit_variational_notears(_data(40, 4, 1), rank=None, epochs=2, batch_size=8, device="cpu", h_every=3)
    assert fit.h_every == 3 and np.all(np.isfinite(fit.adjacency))


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
