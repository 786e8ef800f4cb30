"""cape.causal.pipeline: Step I on arrays, the same graph as cape.tl.causal_graph on an AnnData."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp

from cape import CapeInputError
from cape.causal import CausalConfig, is_dag, learn_causal_graph
from cape.causal.pipeline import check_matrix
from cape.tl import causal_graph

FAST = {"epochs": 3, "batch_size": 32}


def _matrix(n: int = 120, m: int = 6, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, m))
    X[:, 1] += X[:, 0]
    X[:, 2] += 0.8 * X[:, 1]
    return X.astype(np.float32)


def test_the_pipeline_on_arrays_is_what_tl_causal_graph_stores() -> None:
    X, genes = _matrix(), np.array([f"g{i}" for i in range(6)])
    config = CausalConfig(rank=None, tau=0.05, **FAST)
    result = learn_causal_graph(X, genes, config, device="cpu", seed=4)
    adata = ad.AnnData(X)
    adata.var_names = genes
    causal_graph(adata, config, use_genes=None, device="cpu", seed=4)
    np.testing.assert_array_equal(adata.varp["cape_dag"].toarray(), result.dag.astype(np.float32))
    assert is_dag(result.dag) and result.n_edges == adata.uns["cape"]["causal_graph"]["n_edges"]
    stored = adata.uns["cape"]["causal_graph"]
    for key in ("tau_used", "tau_rule", "n_positioned", "rank_used", "epochs_run", "removed_cycle_edges"):
        assert result.record[key] == stored[key]
    assert "params" not in result.record and stored["equations"]["layer"] == "X"  # the adapter's own entries


def test_constant_genes_are_dropped_and_the_labels_follow_the_kept_genes() -> None:
    X = _matrix(m=5)
    X[:, 3] = 1.0
    genes = np.array(list("abcde"))
    intervened = np.zeros_like(X, dtype=bool)
    intervened[:20, 4] = True  # labels on the last gene, after the dropped one
    result = learn_causal_graph(X, genes, CausalConfig(rank=None, tau=0.05, **FAST), intervened=intervened,
                                device="cpu")
    assert list(result.genes) == ["a", "b", "c", "e"] and result.dag.shape == (4, 4)
    assert result.fit.n_intervened == 20


def test_check_matrix_refuses_in_one_line() -> None:
    genes = np.array(["a", "b"])
    X = np.ones((20, 2))
    X[3, 1] = np.nan
    with pytest.raises(CapeInputError, match="NaN or infinite values \\(e.g. gene 'b'\\)"):
        check_matrix(X, genes)
    with pytest.raises(CapeInputError, match="at least 10 cells"):
        check_matrix(np.ones((5, 2)), genes)
    with pytest.raises(CapeInputError, match="cells × genes with 2 gene"):
        check_matrix(np.ones((20, 3)), genes)
    kept, names, dropped = check_matrix(sp.csr_matrix(np.c_[np.arange(20.0), np.ones(20)]), genes)
    assert sp.issparse(kept) and kept.dtype == np.float32 and list(names) == ["a"] and dropped == ["b"]


def _v_structure(n: int = 2000, seed: int = 0) -> np.ndarray:
    """0 → 2 ← 1 and 2 → 3, linear with unit noise: the likelihood tells 0 → 2 from 2 → 0."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    X[:, 2] += 0.8 * X[:, 0] + 0.8 * X[:, 1]
    X[:, 3] += 0.7 * X[:, 2]
    return X.astype(np.float32)


def test_without_labels_the_likelihood_may_turn_edges_on_the_same_gene_pairs() -> None:
    X, genes = _v_structure(), np.array(list("abcd"))
    config = CausalConfig(rank=None, tau=0.05, **FAST)
    on = learn_causal_graph(X, genes, config, device="cpu", seed=1)
    off = learn_causal_graph(X, genes, CausalConfig(rank=None, tau=0.05, orient_by_likelihood=False, **FAST),
                             device="cpu", seed=1)
    assert "likelihood_orientation" not in off.record
    turned = on.record["likelihood_orientation"]["n_edges_turned"]
    assert on.record["likelihood_orientation"]["level"] == 0.05
    np.testing.assert_array_equal((on.dag != 0) | (on.dag != 0).T, (off.dag != 0) | (off.dag != 0).T)
    assert is_dag(on.dag) and int(((on.dag != 0) & (off.dag == 0)).sum()) == turned


def test_with_labels_the_likelihood_does_not_orient() -> None:
    X = _v_structure(400)
    intervened = np.zeros_like(X, dtype=bool)
    intervened[:40, 0] = True
    result = learn_causal_graph(X, np.array(list("abcd")), CausalConfig(rank=None, tau=0.05, **FAST),
                                intervened=intervened, device="cpu")
    assert "likelihood_orientation" not in result.record
