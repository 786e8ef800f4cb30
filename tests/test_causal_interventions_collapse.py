"""Step I on perturbation data (per-cell intervention labels) and the collapse guard (issue 31, items 3 and 4)."""

from __future__ import annotations

import importlib
import logging

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import torch

from cape import CapeInputError
from cape.causal import CausalFit, VariationalNotears, fit_parents_mlp, fit_variational_notears
from cape.causal.parents_mlp import profiled_gaussian_nll
from cape.causal.trainer import (
    COLLAPSE_FLOOR,
    COLLAPSE_RETAINED,
    COLLAPSE_SIGNAL,
    collapse_reason,
    max_correlation,
    near_empty,
)
from cape.tl import causal_graph, intervention_mask

causal_graph_module = importlib.import_module("cape.causal.pipeline")


# --- the likelihood left out for intervened genes ---------------------------------------------------------------
def test_keep_mask_drops_exactly_the_intervened_genes_terms() -> None:
    torch.manual_seed(0)
    model = VariationalNotears(5, rank=None, hidden=4, seed=0).eval()
    with torch.no_grad():
        model.weight.normal_(0, 0.3)
    x = torch.randn(8, 5)
    full = model(x)
    ones = model(x, keep=torch.ones(8, 5))
    torch.testing.assert_close(full["nelbo"], ones["nelbo"])
    keep = torch.ones(8, 5)
    keep[2, 3] = keep[5, 0] = 0.0
    masked = model(x, keep=keep)
    mu = model.encode(x)
    recon = (x - model.decode(mu)).pow(2)
    kl = mu.pow(2)  # σ = 1: the KL per entry is ½μ²
    expected = 0.5 * ((recon + kl) * keep).sum(1).mean()
    torch.testing.assert_close(masked["nelbo"], expected)
    assert masked["kl"] < full["kl"]


def test_profiled_likelihood_averages_each_gene_over_its_kept_cells() -> None:
    torch.manual_seed(1)
    x, predicted = torch.randn(10, 3), torch.randn(10, 3)
    keep = torch.ones(10, 3)
    keep[:4, 1] = 0.0
    keep[:, 2] = 0.0  # no kept cell: the gene adds nothing
    value = profiled_gaussian_nll(predicted, x, keep)
    r = (x - predicted).pow(2)
    expected = 0.5 * (torch.log(r[:, 0].mean()) + torch.log(r[4:, 1].mean()))
    torch.testing.assert_close(value, expected)
    all_kept = profiled_gaussian_nll(predicted, x, torch.ones(10, 3))
    torch.testing.assert_close(all_kept, profiled_gaussian_nll(predicted, x))


def _knockout_data(seed: int, n: int = 600, knocked: int = 200) -> ad.AnnData:
    """g0 → g1 with equal standardised variances (no orientation from observation alone), g2 independent;
    the first ``knocked`` cells have g1 knocked out (``"g1+ctrl"``)."""
    rng = np.random.default_rng(seed)
    x0 = rng.normal(size=n)
    x1 = x0 + rng.normal(size=n)
    x1[:knocked] = 0.1 * rng.normal(size=knocked)
    x2 = rng.normal(size=n)
    a = ad.AnnData(np.c_[x0, x1, x2].astype(np.float32), var=pd.DataFrame(index=["g0", "g1", "g2"]))
    a.obs_names = [f"c{i}" for i in range(n)]
    a.obs["condition"] = pd.Categorical(["g1+ctrl"] * knocked + ["ctrl"] * (n - knocked))
    return a


@pytest.mark.parametrize("seed", range(4))
def test_knockout_labels_orient_the_edge_from_parent_to_knocked_child(seed: int) -> None:
    a = _knockout_data(seed)
    causal_graph(a, rank=None, tau=0.0, epochs=20, batch_size=64, device="cpu", seed=seed,
                 interventions="condition", min_positioned=0)
    dag = a.varp["cape_dag"].toarray()
    assert abs(dag[0, 1]) > 0.2 and dag[1, 0] == 0
    rec = a.uns["cape"]["causal_graph"]
    assert rec["params"]["interventions"] == "condition"
    info = rec["interventions"]
    assert info["n_intervened_cells"] == 200 and info["n_control_cells"] == 400 and info["n_conditions"] == 1
    assert info["n_entries_left_out"] == 200 and list(info["targets"]) == ["g1"]


def test_parents_mlp_takes_the_same_labels() -> None:
    a = _knockout_data(0, n=400, knocked=150)
    X = np.asarray(a.X)
    mask = intervention_mask(a, "condition", np.asarray(a.var_names))[0]
    fit = fit_parents_mlp(X, screen_steps=300, steps=300, batch_size=128, device="cpu", seed=0, intervened=mask)
    assert fit.n_intervened == 150 and fit.adjacency.shape == (3, 3)
    with pytest.raises(ValueError, match="cells × genes"):
        fit_parents_mlp(X, screen_steps=1, steps=1, device="cpu", intervened=mask[:10])


def test_intervention_mask_reads_gears_labels_and_double_knockouts(caplog) -> None:
    a = ad.AnnData(np.zeros((5, 4), dtype=np.float32), var=pd.DataFrame(index=["A", "B", "C", "D"]))
    a.obs["perturbation"] = ["ctrl", "A+ctrl", "A+B", "ctrl+C", "D+ctrl"]
    with caplog.at_level(logging.WARNING, logger="cape"):
        mask, record = intervention_mask(a, "perturbation", np.array(["A", "B", "C"]))
    assert mask.toarray().astype(int).tolist() == [[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 0, 1], [0, 0, 0]]
    assert record["n_intervened_cells"] == 3 and record["n_entries_left_out"] == 4
    assert record["targets_outside_graph"] == ["D"] and "not in the causal graph" in caplog.text


@pytest.mark.parametrize(("labels", "match"), [
    (None, "no such column in adata.obs"),
    (["ctrl", "X+ctrl", "ctrl", "ctrl"], "not in var_names, e.g. 'X'"),
    (["ctrl", "A+B+C", "ctrl", "ctrl"], "not in GEARS format"),
    (["ctrl", None, "ctrl", "ctrl"], "missing label"),
])
def test_bad_intervention_labels_get_one_line_errors(labels, match) -> None:
    a = ad.AnnData(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32),
                   var=pd.DataFrame(index=["A", "B", "C"]))
    if labels is not None:
        a.obs["condition"] = labels
    with pytest.raises(CapeInputError, match=match) as err:
        intervention_mask(a, "condition", np.array(["A", "B", "C"]))
    assert "\n" not in str(err.value)


# --- the collapse guard -------------------------------------------------------------------------------------------
def test_near_empty_and_max_correlation() -> None:
    A = np.zeros((100, 100))
    assert near_empty(A)
    A[0, 1] = 0.5
    A[2, 2] = 0.5  # the diagonal does not count
    assert near_empty(A)  # 1 edge < 2 % of 100 genes
    A[3, 4] = 2 * COLLAPSE_FLOOR
    assert not near_empty(A)
    rng = np.random.default_rng(0)
    F = rng.normal(size=(500, 3))
    F[:, 2] = F[:, 0] + 0.01 * rng.normal(size=500)
    assert max_correlation(F) > 0.99 and max_correlation(F[:, :1]) == 0.0


def test_collapse_reason_needs_an_empty_graph_and_evidence_of_signal() -> None:
    empty = np.zeros((6, 6))
    message = collapse_reason(empty, 0.4, 0.0, 0.1, "lower lambda_sparse")
    assert message.startswith("Step I collapsed") and "reached 0.4" in message
    assert message.endswith("lower lambda_sparse")
    by_data = collapse_reason(empty, 0.0, 0.9, 0.1, "use a dense A")
    assert "correlate by 0.9" in by_data and "L1 price 0.1" in by_data
    assert collapse_reason(empty, 0.0, 0.15, 0.1, "x") == ""  # correlation within twice the price: empty is right
    assert collapse_reason(empty, 0.05, 0.05, None, "x") == ""  # no signal anywhere
    full = np.full((6, 6), 0.3)
    assert collapse_reason(full, 0.4, 0.9, 0.1, "x") == ""
    # 300 independent genes on 700 cells reach |r| ≈ 0.2 among their 44,850 pairs: not evidence of signal
    big = np.zeros((300, 300))
    assert collapse_reason(big, 0.0, 0.18, 0.03, "x", n_rows=700) == ""
    assert collapse_reason(big, 0.0, 0.5, 0.03, "x", n_rows=700).startswith("Step I collapsed")


def test_a_sparse_graph_whose_strongest_weights_stand_is_not_a_collapse() -> None:
    # 2,000 genes, 21 weights above the floor, the largest where it peaked: a sparse network (one gene driving ten
    # others), not a penalty that won against the data, though the correlations are strong
    rng = np.random.default_rng(0)
    sparse = np.zeros((2000, 2000))
    sparse[0, 1:11] = rng.uniform(0.3, 0.62, size=10)
    sparse[rng.integers(20, 2000, 11), rng.integers(20, 2000, 11)] = 0.05
    np.fill_diagonal(sparse, 0.0)
    assert near_empty(sparse)
    assert collapse_reason(sparse, 0.63, 0.9, 0.03, "x", n_rows=3000) == ""
    # the same graph, every weight driven down by an order of magnitude: a collapse
    assert collapse_reason(sparse / 10, 0.63, 0.9, 0.03, "x", n_rows=3000).startswith("Step I collapsed")
    # the strongest weight stands above the signal level but far below its peak: collapsing
    shrunk = sparse * (COLLAPSE_SIGNAL / sparse.max()) * 1.5
    assert collapse_reason(shrunk, shrunk.max() / COLLAPSE_RETAINED * 1.1, 0.9, 0.03, "x").startswith("Step I")
    assert collapse_reason(shrunk, shrunk.max() / COLLAPSE_RETAINED * 0.9, 0.9, 0.03, "x") == ""
    # a weight on the diagonal (masked out of the SEM) is no edge that stands
    diagonal = np.zeros((200, 200))
    diagonal[5, 5] = 0.6
    assert collapse_reason(diagonal, 0.6, 0.0, 0.03, "x").startswith("Step I collapsed")


def test_a_fit_on_independent_genes_is_not_a_collapse_and_records_its_peak() -> None:
    X = np.random.default_rng(0).normal(size=(256, 6)).astype(np.float32)
    fit = fit_variational_notears(X, rank=1, lambda_sparse=30.0, epochs=8, batch_size=64, seed=0, device="cpu",
                                  hidden=4)
    assert not fit.collapsed and fit.collapse_message == ""
    assert len(fit.history["max_weight"]) == fit.epochs_run and fit.peak_weight == max(fit.history["max_weight"])


def _collapsed_fit(X, **_) -> CausalFit:
    A = np.zeros((X.shape[1], X.shape[1]), dtype=np.float32)
    return CausalFit(adjacency=A, converged=False, collapsed=True, peak_weight=0.5,
                     collapse_message="Step I collapsed: A ended with 0 weight(s); lower lambda_sparse (got 1)")


def test_tl_raises_on_a_collapsed_fit_and_only_warns_with_the_checks_off(monkeypatch, caplog) -> None:
    monkeypatch.setattr(causal_graph_module, "fit_variational_notears", _collapsed_fit)
    a = _knockout_data(0)
    with pytest.raises(CapeInputError, match="Step I collapsed: .* lower lambda_sparse"):
        causal_graph(a, rank=None, tau=0.05, device="cpu")
    with caplog.at_level(logging.WARNING, logger="cape"):
        causal_graph(a, rank=None, tau=0.05, device="cpu", min_positioned=0)
    rec = a.uns["cape"]["causal_graph"]
    assert rec["collapsed"] and not rec["converged"] and rec["n_edges"] == 0
    assert "Step I collapsed" in caplog.text


def test_a_collapse_beyond_the_screened_gene_count_names_the_screened_fit(monkeypatch) -> None:
    monkeypatch.setattr(causal_graph_module, "fit_variational_notears", _collapsed_fit)
    a = _knockout_data(0)
    with pytest.raises(CapeInputError) as err:
        causal_graph(a, tau=0.05, device="cpu")
    assert "screens candidate pairs" not in str(err.value)  # within the line the fit was already screened
    monkeypatch.setattr(causal_graph_module, "BUDGET_MAX_GENES", 2)  # the data have 3 genes: beyond the line
    with pytest.raises(CapeInputError) as err:
        causal_graph(a, tau=0.05, device="cpu")
    message = str(err.value)
    assert "\n" not in message and message.startswith("Step I collapsed")
    assert message.endswith(", or use at most 2 genes (preprocess n_top_genes), where Step I screens candidate "
                            "pairs and fits them densely")
    with pytest.raises(CapeInputError) as err:  # a rank the user chose: fewer genes would not screen them
        causal_graph(a, rank=2, tau=0.05, device="cpu")
    assert "screens candidate pairs" not in str(err.value)
