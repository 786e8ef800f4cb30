"""Annotation fine-tuning options: pooling, class weights, learning-rate schedule, early-stopping metrics."""

from __future__ import annotations

import dataclasses
import math
import sys

import numpy as np
import pytest
import torch
from _models_data import cape_adata, one_thread  # noqa: F401  (fixture)
from hypothesis import given, settings
from hypothesis import strategies as st

from cape import CapeInputError
from cape._settings import PROGRESS
from cape.models import CellTransformer, TrainingPlan
from cape.models.modules.heads import ClsDecoder, pool_cells, pooled_width
from cape.models.training.engine import (
    CUDA_PAD_MULTIPLE,
    Plateau,
    Trainer,
    _fused_adamw,
    _Step,
    cell_loader,
    loader_workers,
    lr_factor,
    stopping_patience,
)
from cape.models.training.objectives import balanced_class_weights

SMALL = dict(d_model=32, n_heads=4, n_layers=1, max_len=32, dropout=0.0)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def adata():
    return cape_adata(n_cells=60)


# ------------------------------------------------------------------------------------------------ pure functions
@given(st.integers(1, 6), st.integers(2, 9), st.integers(0, 3))
@settings(max_examples=30, deadline=None)
def test_mean_pooling_is_the_mean_over_unpadded_gene_tokens(batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, length, 5, generator=g, dtype=torch.float64)
    n_tokens = torch.randint(1, length + 1, (batch,), generator=g)          # <cls> + 0..length-1 genes
    padding = torch.arange(length)[None, :] >= n_tokens[:, None]
    mean = pool_cells(hidden, padding, "mean")
    for b in range(batch):
        genes = hidden[b, 1:n_tokens[b]]
        expected = genes.mean(0) if len(genes) else torch.zeros(5, dtype=torch.float64)
        torch.testing.assert_close(mean[b], expected)
    both = pool_cells(hidden, padding, "cls+mean")
    torch.testing.assert_close(both, torch.cat([hidden[:, 0], mean], -1))
    torch.testing.assert_close(pool_cells(hidden, padding, "cls"), hidden[:, 0])
    # Extra padding (any content) changes nothing.
    padded = torch.cat([hidden, torch.randn(batch, 3, 5, generator=g, dtype=torch.float64)], 1)
    torch.testing.assert_close(pool_cells(padded, torch.cat([padding, torch.ones(batch, 3, dtype=bool)], 1),
                                          "mean"), mean)


def test_pooled_width_and_head_input():
    assert pooled_width(8, "cls") == pooled_width(8, "mean") == 8 and pooled_width(8, "cls+mean") == 16
    head = ClsDecoder(8, 3, n_layers=3, d_in=16)
    assert head(torch.zeros(2, 16)).shape == (2, 3)
    assert ClsDecoder(8, 3, n_layers=1, d_in=16)(torch.zeros(2, 16)).shape == (2, 3)
    with pytest.raises(CapeInputError, match="unknown pooling"):
        pool_cells(torch.zeros(1, 2, 8), None, "max")


@given(st.lists(st.integers(0, 4), min_size=1, max_size=40))
@settings(max_examples=40, deadline=None)
def test_balanced_class_weights_match_scikit_learn_and_equalise_classes(codes):
    from sklearn.utils.class_weight import compute_class_weight

    codes = np.asarray(codes)
    weights = balanced_class_weights(codes, 6)
    present = np.unique(codes)
    np.testing.assert_allclose(weights[present], compute_class_weight("balanced", classes=present, y=codes))
    np.testing.assert_array_equal(weights[np.setdiff1d(np.arange(6), present)], 1.0)
    totals = np.bincount(codes, minlength=6)[present] * weights[present]  # every class weighs the same in total
    np.testing.assert_allclose(totals, totals[0])


# ------------------------------------------------------------------------------------------------ train
def _val_cells(model: CellTransformer, adata, validation_fraction: float):
    """The validation cells train() carved out (same seeded, stratified split)."""
    codes = np.searchsorted(model.labels, adata.obs["cell_type"].astype(str).to_numpy())
    _, val = model._split(adata.n_obs, validation_fraction, stratify=codes)
    return adata[val].copy()


def test_early_stopping_keeps_the_best_validation_epoch(adata):
    from sklearn.metrics import balanced_accuracy_score

    # Every gene in the vocabulary, in a plain shuffle: the seed and learning rate were chosen on this trajectory.
    model = CellTransformer(adata, "scgpt", "none", **SMALL, seed=3, vocabulary="all")
    history = model.train(adata, "cell_type", epochs=8, batch_size=8, lr=2e-2, validation_fraction=0.3,
                        early_stopping_patience=None, early_stopping_metric="val_balanced_accuracy",
                        pooling="cls", class_weight=None, length_grouping=None)
    scores = [h["val_balanced_accuracy"] for h in history]
    best = int(np.argmax(scores))
    val = _val_cells(model, adata, 0.3)
    pred = np.asarray(model.predict(val))
    # The kept weights are the best epoch's, and the recorded score is scikit-learn's balanced accuracy.
    assert balanced_accuracy_score(val.obs["cell_type"].astype(str), pred) == pytest.approx(scores[best])
    assert np.mean(pred == val.obs["cell_type"].astype(str).to_numpy()) == pytest.approx(
        history[best]["val_accuracy"])
    assert len({round(s, 6) for s in scores}) > 1                       # the epochs did differ


def test_val_loss_monitor_restores_the_lowest_loss_epoch(adata):
    model = CellTransformer(adata, "scgpt", "none", **SMALL, seed=1)
    history = model.train(adata, "cell_type", epochs=6, batch_size=8, lr=5e-2, validation_fraction=0.3,
                        early_stopping_patience=None, class_weight="balanced")
    losses = [h["val_loss"] for h in history]
    assert int(np.argmin(losses)) != len(losses) - 1, "settings should make the last epoch not the best"
    val = _val_cells(model, adata, 0.3)
    probs = model.predict(val, return_probabilities=True)
    codes = np.searchsorted(model.labels, val.obs["cell_type"].astype(str).to_numpy())
    train_codes = np.searchsorted(model.labels, adata.obs["cell_type"].astype(str).to_numpy())
    _, val_pos = model._split(adata.n_obs, 0.3, stratify=train_codes)
    w = balanced_class_weights(np.delete(train_codes, val_pos), len(model.labels))[codes]
    weighted_ce = float(np.sum(w * -np.log(probs[np.arange(len(codes)), codes])) / w.sum())
    assert weighted_ce == pytest.approx(min(losses), rel=1e-4)          # weighted loss of the restored epoch


def test_cosine_schedule_is_followed_per_step(adata):
    model = CellTransformer(adata, "scgpt", "none", **SMALL, seed=0)
    history = model.train(adata, "cell_type", epochs=4, batch_size=16, lr=1e-3, validation_fraction=0.0,
                        lr_schedule="cosine", warmup_fraction=0.25)
    steps = math.ceil(adata.n_obs / 16)
    for h in history[:-1]:
        assert h["lr"] == pytest.approx(1e-3 * lr_factor(h["epoch"] * steps, 4 * steps, "cosine", 0.25))


@pytest.mark.parametrize("pooling", ["mean", "cls+mean"])
def test_pooling_option_trains_predicts_and_round_trips(adata, tmp_path, pooling):
    model = CellTransformer(adata, "scgpt", "rope", **SMALL, seed=0)
    model.train(adata, "cell_type", epochs=10, batch_size=16, lr=3e-3, validation_fraction=0.0, pooling=pooling,
              class_weight="balanced", lr_schedule="cosine", warmup_fraction=0.1)
    assert model.cls_head.out_layer.in_features == 32
    assert model.cls_head._decoder[0].in_features == pooled_width(32, pooling)
    labels = np.asarray(model.predict(adata))
    assert np.mean(labels == adata.obs["cell_type"].to_numpy()) > 0.7   # marker genes separate the groups
    # Cell embeddings follow the head's pooling unless told otherwise.
    assert model.embed(adata, copy=True, gene_key=None).obsm["X_cape"].shape == (60, pooled_width(32, pooling))
    assert model.embed(adata, copy=True, gene_key=None, pooling="cls").obsm["X_cape"].shape == (60, 32)
    model.save(tmp_path / "m")
    loaded = CellTransformer.load(tmp_path / "m", adata, device="cpu")
    assert loaded.pooling == pooling
    np.testing.assert_array_equal(model.predict(adata, return_probabilities=True),
                                  loaded.predict(adata, return_probabilities=True))
    # Training again with another pooling rebuilds the head at the new width.
    model.train(adata, "cell_type", epochs=1, batch_size=16, validation_fraction=0.0, pooling="cls")
    assert model.pooling == "cls" and model.cls_head._decoder[0].in_features == 32


def test_train_option_errors(adata):
    model = CellTransformer(adata, "scgpt", "none", **SMALL)
    for kwargs, match in [({"pooling": "max"}, "unknown pooling"), ({"class_weight": "inverse"}, "class_weight"),
                          ({"lr_schedule": "step"}, "lr schedule"), ({"warmup_fraction": 1.0}, "warmup_fraction"),
                          ({"early_stopping_metric": "f1"}, "early_stopping_metric"),
                          ({"label_smoothing": 1.0}, "label_smoothing"),
                          ({"early_stopping_min_delta": -0.1}, "early_stopping_min_delta"),
                          ({"early_stopping_monitor": ("val_f1",)}, "early_stopping_monitor names val_f1")]:
        with pytest.raises(CapeInputError, match=match):
            model.train(adata, "cell_type", epochs=1, **kwargs)


def test_plateau_counts_epochs_without_progress_in_any_monitored_score():
    plateau = Plateau(("val_loss", "val_accuracy"), min_delta=0.01)
    counts = [plateau.update({"val_loss": loss, "val_accuracy": acc}) for loss, acc in [
        (1.0, 0.5),       # first epoch: progress
        (0.7, 0.5),       # loss falls: progress
        (0.695, 0.5),     # loss falls less than min_delta: none
        (0.71, 0.8),      # accuracy rises: progress
        (0.697, 0.8),     # 0.003 below the best loss: none
        (0.692, 0.8),     # 0.008 below it, still within min_delta: none
        (0.689, 0.8),     # 0.011 below the best of epoch 2: the creep has added up to progress
        (0.60, 1.0), (0.595, 1.0), (0.592, 1.0), (0.591, 1.0),  # at the ceiling, a loss that creeps down
        (0.40, 1.0), (0.20, 1.0),  # at the ceiling even a loss that falls fast is no progress: all cells are right
        (0.30, 0.9), (0.10, 0.9)]]  # below it again, the loss counts (against its best before the ceiling)
    assert counts == [0, 0, 1, 0, 1, 2, 0, 0, 1, 2, 3, 4, 5, 0, 0]


def test_ceiling_patience_applies_only_while_the_accuracy_is_perfect():
    plan = TrainingPlan(early_stopping_patience=15, early_stopping_monitor=("val_loss", "val_accuracy"),
                        early_stopping_ceiling_patience=3)
    plateau = Plateau(plan.early_stopping_monitor)
    plateau.update({"val_loss": 0.5, "val_accuracy": 0.9})
    assert stopping_patience(plan, plateau) == 15                      # below the ceiling: the full patience
    plateau.update({"val_loss": 0.4, "val_accuracy": 1.0})
    assert stopping_patience(plan, plateau) == 3                       # every validation cell right
    assert stopping_patience(plan, None) == 15                         # no monitor, no ceiling
    assert stopping_patience(dataclasses.replace(plan, early_stopping_ceiling_patience=None), plateau) == 15
    assert stopping_patience(dataclasses.replace(plan, early_stopping_patience=None), plateau) is None


def test_fine_tuning_at_the_ceiling_stops_after_the_ceiling_patience(adata, monkeypatch):
    # Every validation cell right from the first epoch, the loss still falling fast: only the ceiling rule stops.
    losses = iter(np.geomspace(1.0, 1e-6, 40))
    monkeypatch.setattr(Trainer, "evaluate", lambda *_: {"val_loss": float(next(losses)), "val_accuracy": 1.0})
    runs = {ceiling: CellTransformer(adata, "scgpt", "none", **SMALL, seed=1).train(
        adata, "cell_type", epochs=20, batch_size=16, early_stopping_patience=6,
        early_stopping_ceiling_patience=ceiling) for ceiling in (None, 2)}
    assert [len(runs[None]), len(runs[2])] == [7, 3]   # epoch 1 is progress, then the patience runs out
    with pytest.raises(CapeInputError, match="early_stopping_ceiling_patience"):
        CellTransformer(adata, "scgpt", "none", **SMALL).train(adata, "cell_type", epochs=1,
                                                               early_stopping_ceiling_patience=0)


def test_monitored_plateau_stops_training_and_keeps_the_best_epoch(adata):
    model = CellTransformer(adata, "scgpt", "none", **SMALL, seed=1)
    # No loss progress counts (min_delta huge) and the accuracy is not monitored: epochs 2 and 3 make none.
    history = model.train(adata, "cell_type", epochs=8, batch_size=8, lr=5e-2, validation_fraction=0.3,
                          early_stopping_patience=2, early_stopping_monitor=("val_loss",),
                          early_stopping_min_delta=1e3)
    assert len(history) == 3
    # Without the monitor, the same run goes on while the validation loss still falls.
    longer = CellTransformer(adata, "scgpt", "none", **SMALL, seed=1).train(
        adata, "cell_type", epochs=8, batch_size=8, lr=5e-2, validation_fraction=0.3, early_stopping_patience=2,
        early_stopping_monitor=())
    assert len(longer) > 3


def test_training_reports_each_epoch_in_lines_where_no_bar_is_drawn(adata, caplog, monkeypatch):
    import cape

    monkeypatch.setattr(cape.settings, "progress", None)
    monkeypatch.setattr(cape.settings, "verbosity", 1)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    model = CellTransformer(adata, "scgpt", "none", **SMALL, seed=0)
    with caplog.at_level(PROGRESS, logger="cape"):
        model.pretrain(adata, epochs=2, batch_size=16)
        model.train(adata, "cell_type", epochs=2, batch_size=16)
    lines = [r.getMessage() for r in caplog.records if r.levelno == PROGRESS]
    assert [line.split(",")[0] for line in lines] == ["pretrain: epoch 1/2", "pretrain: epoch 2/2",
                                                      "train: epoch 1/2", "train: epoch 2/2"]
    assert "val_loss" in lines[0] and "left" in lines[0]
    assert "val_accuracy" in lines[-1] and "in all" in lines[-1]


def test_cape_train_passes_the_fine_tuning_options(tmp_path):
    import anndata as ad

    from cape.cli import main

    cape_adata(n_cells=40).write_h5ad(tmp_path / "in.h5ad")
    out = tmp_path / "trained.h5ad"
    code = main(["--quiet", "train", "-i", str(tmp_path / "in.h5ad"), "-o", str(out), "--label-key", "cell_type",
                 "--epochs", "3", "--d-model", "16", "--n-heads", "2", "--max-len", "32", "--encoding", "none",
                 "--pooling", "cls+mean", "--class-weight", "none", "--lr-schedule", "cosine",
                 "--warmup-fraction", "0.2", "--early-stopping-metric", "val_accuracy", "--fit-lr", "0.002",
                 "--pretrain-epochs", "2"])
    assert code == 0
    result = ad.read_h5ad(out)
    assert result.obsm["X_cape_fine_tuned"].shape == (40, 32)          # cls+mean: twice d_model
    assert result.obsm["X_cape"].shape == (40, 16)                     # the pretrained <cls> state
    record = result.uns["cape"]["model"]
    assert record["pooling"] == "cls+mean" and len(record["history"]["pretrain"]["epoch"]) == 2
    fit = record["history"]["train"]
    assert len(fit["epoch"]) == 3 and {"val_accuracy", "val_balanced_accuracy", "lr"} <= set(fit)
    assert fit["lr"][-1] == pytest.approx(0.0, abs=1e-12)              # cosine ends at 0


def test_cape_train_fine_tuning_plan_monitors_accuracy_and_loss():
    from cape.cli import build_parser
    from cape.cli.train_command import _fine_tune_plan
    from cape.models.hyperparameters import FINE_TUNE_PLAN

    args = build_parser().parse_args(["train", "-i", "in.h5ad", "-o", "out.h5ad", "--fit-min-delta", "0.05",
                                      "--fit-patience", "4", "--fit-ceiling-patience", "2"])
    plan = _fine_tune_plan(args)
    assert plan.early_stopping_ceiling_patience == 2
    assert plan.early_stopping_monitor == FINE_TUNE_PLAN.early_stopping_monitor == ("val_loss", "val_accuracy")
    assert plan.early_stopping_min_delta == 0.05 and plan.early_stopping_patience == 4
    default = _fine_tune_plan(build_parser().parse_args(["train", "-i", "in.h5ad", "-o", "out.h5ad"]))
    assert default == FINE_TUNE_PLAN                                    # the command line trains as model.train


def test_adamw_runs_fused_where_torch_has_the_kernel():
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    assert _fused_adamw([torch.nn.Parameter(torch.zeros(2))]) is ((major, minor) >= (2, 4))
    assert _fused_adamw([]) is ((major, minor) >= (2, 4))
    step = _Step(torch.nn.Linear(3, 2), TrainingPlan(), total_steps=4, scaled=False)
    assert bool(step.optimizer.defaults["fused"]) is _fused_adamw(step.params)


def test_loader_workers_and_padding_follow_the_device():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert loader_workers(None) == 0 and loader_workers(3) == 3
    for bad in (-1, 1.5):
        with pytest.raises(CapeInputError, match="num_workers"):
            loader_workers(bad)
    data = [{"gene_ids": np.arange(n) + 2, "values": np.ones(n, np.float32), "mask": np.zeros(n, bool)}
            for n in (3, 70)]
    lengths = {dev.type: next(iter(cell_loader(data, dev, 0, batch_size=2, num_workers=0)))["gene_ids"].shape[1]
               for dev in (cpu, cuda)}
    assert lengths == {"cpu": 70, "cuda": 2 * CUDA_PAD_MULTIPLE}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_training_step_matches_the_cpu():
    # One pretraining epoch without autocast on each device from the same weights: the losses agree to float32
    # rounding of different kernels (workers, pinned memory and padding to a multiple of 64 on CUDA only).
    losses, adata = {}, cape_adata()
    for device in ("cpu", "cuda"):
        model = CellTransformer(adata, "scgpt", "cape", d_model=16, n_heads=2, n_layers=1, dropout=0.0,
                                device=device, amp=False, seed=0)
        losses[device] = model.pretrain(adata, epochs=1, validation_fraction=0.0)[-1]["train_loss"]
    assert losses["cuda"] == pytest.approx(losses["cpu"], rel=1e-3)


def test_cuda_graphs_only_where_a_step_can_be_replayed():
    from cape.models.training.engine import graphable

    task = torch.nn.Linear(2, 2)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not graphable(task, TrainingPlan(), cpu, scaled=False)
    assert graphable(task, TrainingPlan(), cuda, scaled=False)
    for plan, scaled in ((TrainingPlan(cuda_graphs=False), False), (TrainingPlan(), True),
                         (TrainingPlan(lr_schedule="cosine"), False), (TrainingPlan(warmup_fraction=0.1), False)):
        assert not graphable(task, plan, cuda, scaled=scaled)
    task.feature_redraw_interval = 100  # a module that redraws on the host every few steps (Performer)
    assert not graphable(task, TrainingPlan(), cuda, scaled=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_training_steps_give_the_kernel_by_kernel_losses():
    # The same batches and updates, replayed: losses agree to rounding (dropout off, float32).
    adata, losses = cape_adata(), {}
    for graphs in (True, False):
        model = CellTransformer(adata, "scgpt", "cape", d_model=16, n_heads=2, n_layers=1, dropout=0.0,
                                device="cuda", amp=False, seed=0)
        history = model.pretrain(adata, epochs=3, batch_size=8, validation_fraction=0.0, cuda_graphs=graphs)
        losses[graphs] = [h["train_loss"] for h in history]
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-3)
