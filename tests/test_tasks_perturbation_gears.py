"""GEARS as a predictor of the perturbation workflow (cape.tasks.perturbation_gears): trained on the training
perturbations only, predicting held-out conditions; on, off or required (``perturb.gears``) with GEARS installed or
not; the ``perturb`` config, schema and ``cape perturb`` options in agreement."""

from __future__ import annotations

import argparse
import logging

import numpy as np
import pandas as pd
import pytest
import yaml
from _models_data import one_thread  # noqa: F401  (fixture)
from _workflow import REPO, snakemake

import cape
from cape import CapeInputError
from cape.tasks import perturbation_workflow as workflow
from cape.tasks.perturbation import PerturbationTask, condition_genes, condition_means
from cape.tasks.perturbation_workflow import PerturbationSettings, perturbation_data, run_perturbation_workflow

pytestmark = pytest.mark.usefixtures("one_thread")

SCHEMA = yaml.safe_load((REPO / "configs" / "schema.yaml").read_text())["properties"]["perturb"]["properties"]
CONFIG = yaml.safe_load((REPO / "configs" / "config.yaml").read_text())["perturb"]


@pytest.fixture(scope="module")
def screen():
    """160 control cells and 14 perturbations of 12 cells on 20 genes, with its true DAG."""
    return cape.data.simulate_perturbation(n_genes=20, n_edges=30, n_control=160, n_cells_per_perturbation=12,
                                           n_single=7, n_double=7, seed=0)


def _gears(screen, **options):
    from cape.tasks.gears import GearsConfig
    from cape.tasks.perturbation_gears import GearsPerturbationPredictor

    # batches of 8: GEARS halves its learning rate every epoch, so on 330 cells batches of 32 leave it untrained
    return GearsPerturbationPredictor(screen.varp["true_dag"], epochs=4, config=GearsConfig(batch_size=8), seed=0,
                                      num_threads=1, **options)


@pytest.fixture(scope="module")
def fitted(screen):
    """GEARS (4 epochs, the true DAG standing in for GO) on the training perturbations of GEARS' split."""
    pytest.importorskip("gears")
    pytest.importorskip("torch_geometric")
    task = PerturbationTask.build(screen)
    predictor = _gears(screen)
    predictor.fit(task.adata, task.train)
    return task, predictor


def test_predicts_held_out_conditions_from_training_cells_only(fitted, screen):
    task, predictor = fitted
    held_out = list(task.split.test)
    predicted = predictor.predict(held_out)
    assert list(predicted.index) == held_out and list(predicted.columns) == list(map(str, screen.var_names))
    assert np.isfinite(predicted.to_numpy()).all() and not predictor.outside_graph_
    labels = screen.obs["condition"].astype(str)
    read = set(predictor.fitted_cells_)
    assert not read & set(screen.obs_names[labels.isin(held_out)])
    assert read == set(screen.obs_names[labels.isin(["ctrl", *task.train])])
    assert set(predictor.val_) < set(task.train) - {"ctrl"}  # its validation set comes from the training conditions


def test_learns_the_direction_of_the_training_shifts(fitted):
    """On the conditions it was trained on, GEARS' predicted change from control points the way the observed one
    does (no change has no direction at all). The perturbed genes themselves are left out: GEARS' loss skips genes
    whose mean is exactly 0 under a perturbation, which a simulated knock-out's target is."""
    task, predictor = fitted
    train = [c for c in task.train if c != "ctrl"]
    control = task.control_mean.to_numpy()
    observed = condition_means(task.adata, train).to_numpy() - control
    change = predictor.predict(train).to_numpy() - control
    genes = list(task.adata.var_names)
    downstream = np.ones(observed.shape, dtype=bool)
    for i, condition in enumerate(train):
        downstream[i, [genes.index(g) for g in condition_genes(condition)]] = False
    cosine = [np.dot(c[m], o[m]) / np.linalg.norm(c[m]) / np.linalg.norm(o[m])
              for c, o, m in zip(change, observed, downstream, strict=True)]
    assert np.median(cosine) > 0.2, cosine
    assert np.corrcoef(change[downstream], observed[downstream])[0, 1] > 0.2


def test_same_seed_same_predictions(fitted, screen):
    task, predictor = fitted
    again = _gears(screen).fit(task.adata, task.train)
    assert again.val_ == predictor.val_
    pd.testing.assert_frame_equal(again.predict(task.split.test), predictor.predict(task.split.test))


def test_too_few_training_perturbations_and_bad_graphs_are_one_line(fitted, screen):
    from cape.tasks.perturbation_gears import GearsPerturbationPredictor

    task, _ = fitted
    with pytest.raises(CapeInputError, match="at least two training perturbations"):
        GearsPerturbationPredictor(screen.varp["true_dag"]).fit(task.adata, ["ctrl", task.train[1]])
    with pytest.raises(CapeInputError, match="go_graph has shape"):
        GearsPerturbationPredictor(np.zeros((3, 3))).fit(task.adata, task.train)
    with pytest.raises(CapeInputError, match="val_fraction"):
        GearsPerturbationPredictor(val_fraction=1.0)


def test_auto_without_gears_skips_it_with_one_log_line(monkeypatch, caplog):
    monkeypatch.setattr(workflow, "gears_available", lambda: False)
    with caplog.at_level(logging.INFO, logger="cape"):
        assert workflow._use_gears("auto", 100) is False
    lines = [r.getMessage() for r in caplog.records if "GEARS" in r.getMessage()]
    assert len(lines) == 1 and "pip install 'cape-sc[gears]'" in lines[0]
    assert workflow._use_gears(False, 100) is False
    monkeypatch.setattr(workflow, "gears_available", lambda: True)
    assert workflow._use_gears("auto", 100) is True and workflow._use_gears(True, 100) is True


def test_required_gears_missing_is_one_line_before_any_fit(monkeypatch, screen):
    monkeypatch.setattr(workflow, "gears_available", lambda: False)
    monkeypatch.setattr(workflow.PerturbationTask, "build", lambda *a, **k: pytest.fail("nothing may run"))
    with pytest.raises(CapeInputError) as err:
        run_perturbation_workflow(perturbation_data(screen, "condition"), PerturbationSettings(gears=True))
    assert "\n" not in str(err.value) and "pip install 'cape-sc[gears]'" in str(err.value)
    with pytest.raises(CapeInputError, match="gears must be auto, true or false"):
        workflow._use_gears("sometimes", 100)


def _perturb_options() -> dict[str, argparse.Action]:
    from cape.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in commands.choices["perturb"]._actions if a.option_strings and a.dest != "help"}


def test_perturb_config_schema_and_cli_agree():
    options = _perturb_options()
    rule_set = {"input", "perturbations", "out_dir", "name"}  # the rule's paths and the top-level key
    assert set(SCHEMA) == set(CONFIG) == set(options) - rule_set
    for key, spec in SCHEMA.items():
        if key == "rank":  # the CLI keeps 'auto' and spells a dense A 'dense'
            continue
        assert spec.get("default") == options[key].default == CONFIG[key], key
    for key in ("gears", "gears_epochs", "gears_go_graph"):
        assert getattr(PerturbationSettings(), key) == SCHEMA[key]["default"], key
    parse = options["gears"].type
    assert [parse(v) for v in ("auto", "true", "false", "False")] == ["auto", True, False, False]


@pytest.mark.parametrize("value, flag", [(None, "--gears auto"), ("False", "--gears false"),
                                         ("True", "--gears true")])
def test_gears_setting_reaches_the_command_line(workdir, value, flag):
    cape.data.simulate_perturbation(n_genes=12, n_edges=15, n_single=4, n_double=3, seed=0).write_h5ad(
        workdir / "screen.h5ad")
    extra = [] if value is None else [f"perturb={{'gears': {value}, 'gears_epochs': 3}}"]
    proc = snakemake(workdir, "-n", "-p", "--config", "input=screen.h5ad", "perturbations=condition", *extra)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if " perturb --input" in x)
    assert flag in line and "--gears-go-graph" not in line
    assert ("--gears-epochs 3" if value else "--gears-epochs 2") in line


def test_draw_cells_keeps_every_condition_its_share():
    from cape.tasks.perturbation_gears import draw_cells

    labels = np.array(["ctrl"] * 600 + ["A+ctrl"] * 300 + ["B+ctrl"] * 12 + ["held+ctrl"] * 50)
    assert np.array_equal(draw_cells(labels, ["ctrl", "A+ctrl", "B+ctrl"], None), np.arange(912))
    drawn = draw_cells(labels, ["ctrl", "A+ctrl", "B+ctrl"], 300, seed=1)
    counts = pd.Series(labels[drawn]).value_counts()
    assert counts.to_dict() == {"ctrl": 197, "A+ctrl": 99, "B+ctrl": 10}  # shares of 300 of 912; B at least 10
    assert np.array_equal(drawn, np.sort(drawn)) and np.array_equal(drawn, draw_cells(
        labels, ["ctrl", "A+ctrl", "B+ctrl"], 300, seed=1))
