"""Position sources: DAG topological order, per-cell expression rank, co-expression / gene2vec vectors."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import torch

import cape.encodings as E
from cape import CapeInputError
from cape.encodings.ordering import expression_rank_positions, topological_positions
from cape.encodings.static_absolute import StaticAbsoluteEncoding, co_expression_vectors, read_gene2vec
from cape.hyperbolic.generality import pagerank_generality


def test_topological_positions_respect_edges_and_break_ties_by_generality():
    g = nx.gnp_random_graph(30, 0.15, seed=1, directed=True)
    dag = nx.DiGraph([(u, v) for u, v in g.edges if u < v])
    dag.add_nodes_from(range(30))
    adjacency = nx.to_scipy_sparse_array(dag, nodelist=range(30)) * 0.5
    ranks = topological_positions(adjacency)
    assert sorted(ranks) == list(range(30))
    assert all(ranks[u] < ranks[v] for u, v in dag.edges)
    # three isolated nodes: only generality decides, higher first
    gen = np.array([0.1, 0.7, 0.4])
    np.testing.assert_array_equal(topological_positions(np.zeros((3, 3)), generality=gen), [2, 0, 1])
    used = np.ones(30, dtype=bool)
    used[[3, 7]] = False
    r = topological_positions(dag, used=used, normalise=True)
    assert np.isnan(r[[3, 7]]).all() and np.nanmax(r) == 1.0 and np.nanmin(r) == 0.0


def test_pagerank_generality_scores_roots_high_and_cycles_are_rejected():
    chain = sp.csr_matrix(np.diag(np.ones(4), k=1))  # 0 → 1 → 2 → 3 → 4
    pi = pagerank_generality(chain)
    assert np.all(np.diff(pi) < 0)
    cyclic = np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=float)
    with pytest.raises(CapeInputError, match="cycle"):
        topological_positions(cyclic)
    with pytest.raises(CapeInputError, match="square"):
        topological_positions(np.zeros((2, 3)))


def test_expression_rank_positions():
    values = torch.tensor([[0.5, 3.0, 0.0, 3.0], [1.0, 2.0, 9.0, 4.0]])
    pad = torch.tensor([[False, False, False, False], [False, False, True, False]])
    ranks = expression_rank_positions(values, pad)
    torch.testing.assert_close(ranks, torch.tensor([[2.0, 0.0, 3.0, 1.0], [2.0, 1.0, 3.0, 0.0]]))


def test_rope_expression_order_needs_values():
    enc = E.get("rope", d_model=16, n_heads=2, n_layers=1, vocab_size=5, order="expression")
    with pytest.raises(CapeInputError, match="values="):
        enc.begin(torch.zeros(1, 3, dtype=torch.long), None)


def test_co_expression_vectors_reproduce_the_correlation():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(200, 3))
    X = np.hstack([base, base[:, :1] * 2 + rng.normal(scale=0.1, size=(200, 1)), np.ones((200, 1))])
    vec = co_expression_vectors(X, dim=5)
    corr = np.corrcoef(X[:, :4], rowvar=False)
    np.testing.assert_allclose(vec[:4] @ vec[:4].T, corr, atol=1e-4)  # full rank: exact factorisation
    np.testing.assert_allclose(vec[4], 0.0)  # constant gene: zero row
    np.testing.assert_allclose(co_expression_vectors(sp.csr_matrix(X), dim=5), vec, atol=1e-5)
    with pytest.raises(CapeInputError):
        co_expression_vectors(X, dim=9)


def test_co_expression_vectors_of_many_genes_never_form_the_correlation(monkeypatch, caplog):
    import importlib

    module = importlib.import_module("cape.encodings.static_absolute")
    rng = np.random.default_rng(1)
    factors = rng.normal(size=(300, 3)) * np.array([3.0, 2.0, 1.0])
    X = factors @ rng.normal(size=(3, 60)) + rng.normal(scale=0.3, size=(300, 60))
    X = np.hstack([np.clip(X - X.min(), 0, None), np.zeros((300, 1))])  # and a constant gene
    dense = co_expression_vectors(sp.csr_matrix(X), dim=3)
    monkeypatch.setattr(module, "CO_EXPRESSION_DENSE_MAX_GENES", 10)
    with caplog.at_level("INFO", logger="cape"):
        implicit = co_expression_vectors(sp.csr_matrix(X), dim=3)
    assert "the correlation is not formed" in caplog.text
    # The same rank-3 factorisation of the correlation (vectors agree up to sign: compare their Gram matrices).
    np.testing.assert_allclose(implicit @ implicit.T, dense @ dense.T, atol=1e-3)
    np.testing.assert_allclose(implicit[-1], 0.0)


def test_static_absolute_from_gene2vec_file(tmp_path):
    path = tmp_path / "g2v.txt"
    path.write_text("3 4\nGATA1 1 0 0 0\nSPI1 0 2 0 0\nUNUSED 0 0 0 5\n")
    pos = read_gene2vec(path, ["<pad>", "SPI1", "GATA1", "CD3E"])
    assert pos.has_position.tolist() == [False, True, True, False]
    enc = E.get("static_absolute", d_model=8, n_heads=2, n_layers=1, vocab_size=4, gene2vec_path=str(path),
                gene_names=["<pad>", "SPI1", "GATA1", "CD3E"])
    assert not any(p.requires_grad for p in enc.parameters())
    ids = torch.tensor([[0, 1, 2, 3]])
    emb = enc.input_embedding(ids, enc.begin(ids, None))
    assert emb.shape == (1, 4, 8)
    assert torch.all(emb[0, 0] == 0) and torch.all(emb[0, 3] == 0)
    assert emb[0, 1, 1] > 0 and emb[0, 2, 0] > 0 and torch.all(emb[0, :, 4:] == 0)
    (tmp_path / "bad.txt").write_text("GATA1 1 0\nSPI1 0\n")
    with pytest.raises(CapeInputError, match="expected 2 numbers"):
        read_gene2vec(tmp_path / "bad.txt", ["GATA1", "SPI1"])
    with pytest.raises(CapeInputError, match="not found"):
        read_gene2vec(tmp_path / "missing.txt", ["GATA1"])


def test_static_absolute_from_expression_matrix():
    rng = np.random.default_rng(1)
    X = sp.csr_matrix(rng.poisson(1.0, size=(50, 6)).astype(float))
    enc = StaticAbsoluteEncoding.from_expression(X, [2, 3, 4, 5, 6, 7], d_model=8, n_heads=2, n_layers=1,
                                                 vocab_size=8)
    assert enc.has_position_table.tolist() == [False, False] + [True] * 6
    ids = torch.tensor([[0, 1, 2, 7]])
    emb = enc.input_embedding(ids, enc.begin(ids, None))
    assert torch.all(emb[0, :2] == 0) and emb[0, 2:].abs().sum() > 0
    with pytest.raises(CapeInputError, match="columns"):
        StaticAbsoluteEncoding.from_expression(X, [2, 3], d_model=8, n_heads=2, n_layers=1, vocab_size=8)
