"""Perturbation predictions scored by cell-eval (the optional extra `perturb`): the predicted cells, the scores
of a perfect and a no-change prediction, and the refusals."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from cape import CapeInputError
from cape.data.perturbation_data import simulate_perturbation
from cape.tasks import cell_eval_scores
from cape.tasks.perturbation import condition_means, validate_perturbation_data
from cape.tasks.perturbation_cell_eval import _cell_eval_names, predicted_cells


@pytest.fixture(scope="module")
def screen():
    adata = simulate_perturbation(n_genes=30, n_edges=50, n_control=120, n_cells_per_perturbation=20, n_single=8,
                                  n_double=6, seed=3)
    conditions = validate_perturbation_data(adata)
    truth = condition_means(adata, conditions)
    control = condition_means(adata, ["ctrl"]).iloc[0]
    no_change = pd.DataFrame(np.tile(control.to_numpy(), (len(conditions), 1)), index=conditions,
                             columns=truth.columns)
    return adata, conditions, truth, no_change


def test_predicted_cells_have_the_predicted_means_and_no_negative_value():
    rng = np.random.default_rng(0)
    control = rng.gamma(2.0, 1.0, size=(50, 6)).astype(np.float32)
    means = pd.DataFrame([[0.0, 0.5, 2.0, 9.0, -1.0, 3.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]], index=["A+ctrl", "A+B"])
    cells = predicted_cells(means, control, [20, 80], seed=1)  # 80 > 50 control cells: drawn with replacement
    assert cells.shape == (100, 6) and cells.min() >= 0
    np.testing.assert_allclose(cells[:20].mean(0), means.iloc[0].clip(lower=0), atol=1e-5)
    np.testing.assert_allclose(cells[20:].mean(0), means.iloc[1], atol=1e-5)
    np.testing.assert_array_equal(cells, predicted_cells(means, control, [20, 80], seed=1))  # seeded


def test_singles_are_named_by_their_gene_for_cell_eval():
    assert _cell_eval_names(["A+ctrl", "ctrl+B", "A+B"], "ctrl") == {"A+ctrl": "A", "ctrl+B": "B", "A+B": "A+B"}
    assert _cell_eval_names(["A+ctrl", "A+B"], "A") == {"A+ctrl": "A+ctrl", "A+B": "A+B"}  # clashes: unchanged


def test_without_the_extra_the_refusal_is_one_line(screen, monkeypatch):
    adata, _, truth, _ = screen
    monkeypatch.setitem(sys.modules, "cell_eval", None)  # `import cell_eval` now raises ImportError
    with pytest.raises(CapeInputError) as err:
        cell_eval_scores(truth, adata)
    assert 'pip install "cape-sc[perturb]"' in str(err.value) and "\n" not in str(err.value)


def test_a_perfect_prediction_beats_no_change_on_cell_eval_scores(screen):
    pytest.importorskip("cell_eval")
    adata, conditions, truth, no_change = screen
    perfect, perfect_summary = cell_eval_scores(truth.iloc[:, ::-1], adata, seed=0)  # any column order
    flat, flat_summary = cell_eval_scores(no_change, adata, seed=0)
    assert list(perfect.index) == list(flat.index) == conditions
    assert {"pearson_delta", "mse", "mae", "discrimination_score_l1", "overlap_at_N"} <= set(perfect.columns)
    # cell-eval's main correlation: the change from control over all genes
    assert perfect_summary["pearson_delta"] > 0.99 > 0.1 > abs(flat_summary["pearson_delta"])
    assert (flat["pearson_delta"] == 0).all()  # no change carries no direction
    assert perfect_summary["mse"] < 1e-8 < flat_summary["mse"]
    assert perfect_summary["overlap_at_N"] > flat_summary["overlap_at_N"]
    assert perfect_summary["discrimination_score_l1"] > flat_summary["discrimination_score_l1"]
    subset, _ = cell_eval_scores(truth, adata, conditions[:3], profile="vcc")
    assert list(subset.index) == conditions[:3] and "pearson_delta" not in subset


def test_bad_input_is_refused_in_one_line(screen):
    pytest.importorskip("cell_eval")
    adata, conditions, truth, _ = screen
    cases = [((truth.iloc[:2], adata, conditions), "no prediction for"),
             ((truth.iloc[:, :-1], adata), "not the genes"),
             ((truth, adata, ["ctrl"]), "not a condition to score"),
             ((truth * np.nan, adata), "NaN"),
             ((truth, adata[adata.obs["condition"] != "ctrl"]), "control cells")]
    for args, message in cases:
        with pytest.raises(CapeInputError, match=message):
            cell_eval_scores(*args)
    with pytest.raises(CapeInputError, match="profiles are"):
        cell_eval_scores(truth, adata, profile="everything")
