"""The structural-equation predictor's target value: do(x = 0) for knock-outs, or each target's level in the
training perturbations (knock-downs, activations), on a linear SEM where the right answer is known exactly."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest

from cape import CapeInputError
from cape.report.perturbation_report import report_text
from cape.tasks.perturbation_scm import SCMPerturbationPredictor
from cape.tasks.perturbation_workflow import PerturbationSettings, perturbation_data, run_perturbation_workflow

GENES = ["a", "b", "c", "d", "e", "f"]
EDGES = {("a", "b"): 1.5, ("c", "d"): -1.0, ("e", "f"): 0.8}  # three regulator → target pairs
LIFT = {"a": 3.0, "c": 2.0, "e": 2.5}  # activation: the regulator's level moved up by this much


def _cells(rng: np.random.Generator, n: int, do: dict[str, float]) -> np.ndarray:
    """n cells of the linear SEM x_child = w · x_parent + ε, regulators N(1, 0.5²), ``do`` fixing genes."""
    x = pd.DataFrame(rng.normal(0.0, 0.3, (n, len(GENES))), columns=GENES)
    for parent in ("a", "c", "e"):
        x[parent] = do.get(parent, 1.0 + 0.5 * rng.standard_normal(n))
    for (parent, child), w in EDGES.items():
        x[child] += w * x[parent]
    return x.to_numpy()


@pytest.fixture(scope="module")
def activation_screen() -> ad.AnnData:
    """Control cells and one activation of each regulator (its level raised by LIFT), 400 and 200 cells."""
    rng = np.random.default_rng(0)
    blocks, labels = [_cells(rng, 400, {})], ["ctrl"] * 400
    for gene, lift in LIFT.items():
        blocks.append(_cells(rng, 200, {gene: 1.0 + lift}))
        labels += [f"{gene}+ctrl"] * 200
    obs = pd.DataFrame({"condition": labels}, index=[f"cell{i}" for i in range(len(labels))])
    return ad.AnnData(np.vstack(blocks).astype(np.float32), obs=obs, var=pd.DataFrame(index=GENES))


def _true_dag() -> np.ndarray:
    A = np.zeros((len(GENES), len(GENES)))
    for (parent, child), w in EDGES.items():
        A[GENES.index(parent), GENES.index(child)] = w
    return A


def test_training_levels_are_the_training_cells_means_and_unseen_targets_move_by_the_median(activation_screen):
    labels = activation_screen.obs["condition"].astype(str).to_numpy()
    model = SCMPerturbationPredictor(_true_dag(), equations="linear", value="training")
    model.fit(activation_screen, ["ctrl", "a+ctrl", "c+ctrl"])
    X = activation_screen.X
    for gene in ("a", "c"):
        assert model.target_value(gene) == pytest.approx(X[labels == f"{gene}+ctrl", GENES.index(gene)].mean(),
                                                         rel=1e-6)
    control_mean = X[labels == "ctrl"].mean(0)
    shifts = [model.target_value(g) - control_mean[GENES.index(g)] for g in ("a", "c")]
    assert model.target_value("e") == pytest.approx(control_mean[GENES.index("e")] + np.median(shifts), rel=1e-5)
    assert SCMPerturbationPredictor(_true_dag(), equations="linear").fit(activation_screen, ["ctrl", "a+ctrl"]) \
        .target_value("a") == 0.0


def test_activations_are_predicted_in_the_right_direction_only_with_training_levels(activation_screen):
    labels = activation_screen.obs["condition"].astype(str).to_numpy()
    observed = activation_screen.X[labels == "e+ctrl"].mean(0) - activation_screen.X[labels == "ctrl"].mean(0)
    shift = {}
    for value in (0.0, "training"):
        model = SCMPerturbationPredictor(_true_dag(), equations="linear", value=value)
        model.fit(activation_screen, ["ctrl", "a+ctrl", "c+ctrl"])  # e's activation is never seen
        shift[value] = model.predict(["e+ctrl"]).to_numpy()[0] - activation_screen.X[labels == "ctrl"].mean(0)
    f = GENES.index("f")
    assert observed[f] > 1.0
    assert shift[0.0][f] < 0  # a knock-out moves e's target the wrong way
    # e is moved by the median lift of a and c (2.5, as its own), so f's shift is w · 2.5 up to sampling noise
    assert shift["training"][f] == pytest.approx(observed[f], abs=0.15)


def test_unknown_target_value_and_no_training_perturbation_are_refused(activation_screen):
    with pytest.raises(CapeInputError, match="value must be a number or 'training'"):
        SCMPerturbationPredictor(_true_dag(), equations="linear", value="activate")
    with pytest.raises(CapeInputError, match="needs training perturbations"):
        SCMPerturbationPredictor(_true_dag(), equations="linear", value="training").fit(activation_screen, ["ctrl"])
    with pytest.raises(CapeInputError, match="target_value must be one of zero, training"):
        run_perturbation_workflow(perturbation_data(activation_screen, "condition"),
                                  PerturbationSettings(target_value="up"))


def test_the_workflow_reports_its_target_value(activation_screen):
    data = perturbation_data(activation_screen, "condition")
    settings = PerturbationSettings(causal_epochs=2, transformer=False, cell_eval=False, gears=False,
                                    target_value="training")
    run = run_perturbation_workflow(data, settings)
    assert run.target_value == "training"
    text = report_text(run, pd.DataFrame(columns=["metric", "subgroup", "baseline", "predictor", "n", "difference",
                                                  "low", "high", "verdict"]), name="screen", plot=None)
    assert "perturb.target_value: training" in text


def test_gears_on_too_few_genes_is_skipped_on_auto_and_refused_when_required(activation_screen, caplog):
    data = perturbation_data(activation_screen, "condition")
    with pytest.raises(CapeInputError, match="the data have 6 genes; GEARS needs at least 20"):
        run_perturbation_workflow(data, PerturbationSettings(gears=True))
    pytest.importorskip("gears")
    with caplog.at_level("INFO", logger="cape"):
        run = run_perturbation_workflow(data, PerturbationSettings(causal_epochs=2, transformer=False,
                                                                   cell_eval=False, gears="auto"))
    assert "gears" not in set(run.per_perturbation["predictor"])
    assert "GEARS skipped: the data have 6 genes" in caplog.text
