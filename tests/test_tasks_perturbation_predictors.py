"""The "train_mean" and "linear" perturbation baselines (Ahlmann-Eltze, Huber & Anders 2025) on data whose
expression changes have a known low-rank linear structure."""

from __future__ import annotations

import logging

import anndata as ad
import numpy as np
import pandas as pd
import pytest

from cape import CapeInputError
from cape.data.perturbation_data import simulate_perturbation
from cape.tasks import (
    AdditivePredictor,
    LinearPerturbationPredictor,
    NoChangePredictor,
    PerturbationTask,
    TrainingMeanPredictor,
)

N_GENES, RANK = 30, 3


def _linear_data(*, singles=range(N_GENES), doubles=(), noise=0.0, seed=0) -> tuple[ad.AnnData, pd.DataFrame]:
    """Cells whose perturbation shifts follow ``shift(j) = A M A[j]`` (rank 3), and the true condition means.

    The columns of A sum to zero over the genes, so the per-column centring of the gene PCA removes only the
    expression offset and the top components span A exactly. Noise comes in ± pairs: condition means are exact.
    """
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(N_GENES, RANK))
    a -= a.mean(axis=0)
    m = rng.normal(size=(RANK, RANK))
    genes = [f"G{i}" for i in range(N_GENES)]
    control = 5.0 + a @ rng.normal(size=RANK)
    means = {"ctrl": control}
    means |= {f"G{j}+ctrl": control + a @ m @ a[j] for j in singles}
    means |= {f"G{i}+G{j}": control + a @ m @ (a[i] + a[j]) for i, j in doubles}
    blocks, labels = [], []
    for cond, mean in means.items():
        eps = rng.normal(0, noise, size=(2, N_GENES))
        blocks += [mean + eps, mean - eps]
        labels += [cond] * 4
    adata = ad.AnnData(np.vstack(blocks), obs=pd.DataFrame({"condition": labels},
                                                           index=[f"c{i}" for i in range(len(labels))]),
                       var=pd.DataFrame(index=genes))
    return adata, pd.DataFrame(means, index=genes).T


def _mse(predicted: pd.DataFrame, truth: pd.DataFrame) -> float:
    return float(((predicted - truth.loc[predicted.index]) ** 2).to_numpy().mean())


def test_train_mean_is_the_mean_of_the_training_condition_means():
    adata, _ = _linear_data(singles=range(5), noise=0.5)
    adata = adata[:22].copy()  # G4+ctrl (last) keeps 2 of its 4 cells: a cell mean would weight it less
    x, labels = adata.X, adata.obs["condition"].to_numpy()
    train = ["G1+ctrl", "G4+ctrl", "ctrl", "G2+ctrl"]  # control in train is not a training perturbation
    want = np.mean([x[labels == c].mean(axis=0) for c in ("G1+ctrl", "G4+ctrl", "G2+ctrl")], axis=0)
    got = TrainingMeanPredictor().fit(adata, train).predict(["G0+ctrl", "G0+G3", "ctrl"])
    for cond in got.index:
        np.testing.assert_allclose(got.loc[cond].to_numpy(), want)
    assert TrainingMeanPredictor.name == "train_mean" and LinearPerturbationPredictor.name == "linear"


@pytest.mark.parametrize("predictor", [TrainingMeanPredictor(), LinearPerturbationPredictor()], ids=lambda p: p.name)
def test_predictions_are_conditions_by_genes(predictor):
    adata, _ = _linear_data(singles=range(10), noise=0.2)
    conditions = ["G9+ctrl", "G1+G8", "ctrl", "G0+ctrl"]
    got = predictor.fit(adata, [f"G{j}+ctrl" for j in range(1, 8)]).predict(conditions)
    assert list(got.index) == conditions
    assert list(got.columns) == list(adata.var_names)
    assert all(np.issubdtype(t, np.floating) for t in got.dtypes)
    assert predictor.predict([]).shape == (0, N_GENES)


def test_linear_recovers_held_out_singles():
    adata, truth = _linear_data(noise=0.3, seed=1)
    train, test = [f"G{j}+ctrl" for j in range(20)], [f"G{j}+ctrl" for j in range(20, 30)]
    errors = {p.name: _mse(p.fit(adata, train).predict(test), truth)
              for p in (LinearPerturbationPredictor(), TrainingMeanPredictor(), NoChangePredictor())}
    # the genes' rows of the PCA embedding place a held-out perturbation; no-change and the mean cannot
    assert errors["linear"] < 0.25 * errors["no_change"]
    assert errors["linear"] < 0.25 * errors["train_mean"]


def test_linear_fits_exactly_once_k_reaches_the_rank():
    adata, truth = _linear_data(doubles=[(0, 1), (2, 7)])
    singles = [f"G{j}+ctrl" for j in range(N_GENES)]
    exact = LinearPerturbationPredictor(n_components=10, ridge_penalty=1e-10).fit(adata, singles)
    assert exact.n_components_ == RANK  # components beyond the rank are zero and dropped
    # the doubles were not trained on: their sum-of-rows embedding makes them exact too (shifts add here)
    np.testing.assert_allclose(exact.predict(list(truth.index)), truth, atol=1e-8)
    short = LinearPerturbationPredictor(n_components=RANK - 1, ridge_penalty=1e-10).fit(adata, singles)
    assert _mse(short.predict(singles), truth) > 0.1


def test_linear_ridge_limit_is_the_mean_change_offset():
    adata, _ = _linear_data(singles=range(12), noise=0.2)
    train = [f"G{j}+ctrl" for j in range(8)]
    got = LinearPerturbationPredictor(ridge_penalty=1e12).fit(adata, train).predict(["G10+ctrl", "G3+G11", "ctrl"])
    x, labels = adata.X, adata.obs["condition"].to_numpy()
    control = x[labels == "ctrl"].mean(axis=0)
    # b averages the change over the training perturbations and the control column (change 0)
    offset = sum(x[labels == c].mean(axis=0) - control for c in train) / (len(train) + 1)
    for cond in got.index:
        np.testing.assert_allclose(got.loc[cond].to_numpy(), control + offset, atol=1e-8)
    assert np.abs(offset).max() > 0.1  # the limit is not simply no change


def test_linear_double_adds_its_singles_around_the_offset():
    adata, _ = _linear_data(singles=range(15), noise=0.3, seed=2)
    model = LinearPerturbationPredictor().fit(adata, [f"G{j}+ctrl" for j in range(10)])
    got = model.predict(["G3+G12", "G3+ctrl", "ctrl+G12", "ctrl"])
    np.testing.assert_allclose(got.loc["G3+G12"] - got.loc["ctrl"],
                               (got.loc["G3+ctrl"] - got.loc["ctrl"]) + (got.loc["ctrl+G12"] - got.loc["ctrl"]),
                               atol=1e-10)


def test_linear_gene_outside_the_data_falls_back_to_the_offset(caplog):
    adata, _ = _linear_data(singles=range(10), noise=0.2)
    model = LinearPerturbationPredictor().fit(adata, [f"G{j}+ctrl" for j in range(8)])
    with caplog.at_level(logging.WARNING, logger="cape"):
        got = model.predict(["NOTAGENE+ctrl", "ctrl", "G2+NOTAGENE", "G2+ctrl"])
    assert "NOTAGENE" in caplog.text
    pd.testing.assert_series_equal(got.loc["NOTAGENE+ctrl"], got.loc["ctrl"], check_names=False)
    pd.testing.assert_series_equal(got.loc["G2+NOTAGENE"], got.loc["G2+ctrl"], check_names=False)


@pytest.mark.parametrize("predictor", [AdditivePredictor(), TrainingMeanPredictor(), LinearPerturbationPredictor()],
                         ids=lambda p: p.name)
def test_labels_not_in_gears_form_are_refused_like_the_additive_predictor(predictor):
    adata, _ = _linear_data(singles=range(6), noise=0.2)
    predictor.fit(adata, ["G0+ctrl", "G1+ctrl", "G2+ctrl"])
    with pytest.raises(CapeInputError, match="not in GEARS format"):
        predictor.predict(["G0+G1+G2"])


@pytest.mark.parametrize("predictor", [TrainingMeanPredictor(), LinearPerturbationPredictor()], ids=lambda p: p.name)
def test_fit_without_training_perturbations_is_refused(predictor):
    adata, _ = _linear_data(singles=range(4), noise=0.2)
    for train in ([], ["ctrl"]):
        with pytest.raises(CapeInputError, match="no training perturbations"):
            predictor.fit(adata, train)
    with pytest.raises(CapeInputError, match="has no cells"):
        predictor.fit(adata, ["G9+ctrl"])


def test_linear_rejects_bad_settings_and_unknown_training_genes():
    for k in (0, -3, 2.5, True):
        with pytest.raises(CapeInputError, match="n_components must be a positive integer"):
            LinearPerturbationPredictor(n_components=k)
    for penalty in (0.0, -1.0, float("nan")):
        with pytest.raises(CapeInputError, match="ridge_penalty must be a positive number"):
            LinearPerturbationPredictor(ridge_penalty=penalty)
    adata, _ = _linear_data(singles=range(4), noise=0.2)
    labels = adata.obs["condition"].to_numpy().copy()
    labels[-4:] = "X9+ctrl"
    adata.obs["condition"] = labels
    with pytest.raises(CapeInputError, match="absent from var_names: X9\\+ctrl"):
        LinearPerturbationPredictor().fit(adata, ["G0+ctrl", "X9+ctrl"])


def test_both_baselines_score_in_the_perturbation_task():
    sim = simulate_perturbation(n_genes=30, n_edges=50, n_control=120, n_cells_per_perturbation=20, n_single=16,
                                n_double=24, seed=0)
    task = PerturbationTask.build(sim)
    for predictor in (TrainingMeanPredictor(), LinearPerturbationPredictor()):
        scores = task.score(predictor)
        assert np.isfinite(scores["mse_overall"]) and scores["mse_overall"] >= 0
        assert -1 <= scores["pearson_delta_overall"] <= 1
