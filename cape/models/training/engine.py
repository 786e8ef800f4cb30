"""The training engine of :class:`~cape.models.CellTransformer`: train a torch task module on cell datasets.

A :class:`TrainingPlan` says how (AdamW, gradient clipping, learning-rate schedule, validation share, early
stopping); a :class:`Trainer` knows where (device, mixed precision, seed) and runs a plan for a number of epochs on a
task module (:mod:`~cape.models.training.objectives`) with a loss function, keeping the weights of the best
validation epoch. Batches come in a seeded order (:mod:`~cape.models.training.sampling`: cells of similar token
counts batched together by default, the same global order under DDP); under ``torchrun`` the task is wrapped in
``DistributedDataParallel``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.model_selection import train_test_split
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, Subset

from ..._cuda_graphs import CapturedStep
from ..._errors import CapeInputError
from ..._progress import progress
from ..tokenize import CellCollator, CellDataset
from . import distributed
from .objectives import LossFn, ScoreFn
from .sampling import LengthGroupedShuffle, SeededShuffle, check_length_grouping

logger = logging.getLogger("cape")

#: ``lr_schedule=`` choices.
SCHEDULES = ("constant", "cosine")


def lr_factor(step: int, total_steps: int, schedule: str = "constant", warmup_fraction: float = 0.0) -> float:
    """Learning-rate multiplier at optimiser ``step`` (0-based) of ``total_steps``.

    ``"constant"``: 1 after a linear warm-up; ``"cosine"``: linear warm-up over ``warmup_fraction`` of the steps,
    then half a cosine from 1 down to 0 at ``total_steps``. The warm-up ramps ``(step + 1) / n_warmup`` so that the
    first step already moves the weights.
    """
    n_warmup = round(warmup_fraction * total_steps)
    if step < n_warmup:
        return (step + 1) / n_warmup
    if schedule == "constant":
        return 1.0
    progress_ = (step - n_warmup) / max(total_steps - n_warmup, 1)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress_, 1.0)))


def validation_split(n: int, validation_fraction: float, seed: int, stratify: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Sorted training and validation positions of ``n`` cells; stratified when every stratum has two cells."""
    if not 0.0 <= validation_fraction < 1.0:
        raise CapeInputError(f"validation_fraction must be in [0, 1), got {validation_fraction}")
    n_val = round(validation_fraction * n)
    if n_val == 0:
        return np.arange(n), np.arange(0)
    ok_strata = stratify is not None and np.bincount(stratify).min(initial=2) >= 2 and n_val >= len(
        np.unique(stratify))
    train, val = train_test_split(np.arange(n), test_size=n_val, random_state=seed % (2**32),
                                  stratify=stratify if ok_strata else None)
    return np.sort(train), np.sort(val)


@dataclass(frozen=True)
class TrainingPlan:
    """How to optimise, validate and stop: the options of :meth:`CellTransformer.pretrain
    <cape.models.CellTransformer.pretrain>` and :meth:`~cape.models.CellTransformer.train` beside the number of
    epochs and the batch size.

    Both methods take a plan (``plan=``) and any of its fields by name (``lr=3e-3``), which override the plan; their
    defaults are :data:`~cape.models.hyperparameters.PRETRAIN_PLAN` and
    :data:`~cape.models.hyperparameters.FINE_TUNE_PLAN`.

    Attributes
    ----------
    lr, weight_decay
        AdamW's learning rate and weight decay.
    grad_clip
        Maximum gradient norm (None: no clipping).
    validation_fraction
        Share of the cells held out to score each epoch (0: no validation, the last epoch is kept).
    early_stopping_patience
        Epochs without a better validation score before stopping (None: never stop early; the best validation
        epoch's weights are kept either way).
    early_stopping_metric
        The validation score that picks the best epoch: ``"val_loss"`` is minimised, any other score
        (``"val_accuracy"``, ``"val_balanced_accuracy"`` when annotating) maximised with ``val_loss`` breaking ties.
    early_stopping_monitor, early_stopping_min_delta
        The validation scores whose progress resets the patience (empty: ``early_stopping_metric`` alone): an epoch
        makes progress when a monitored loss falls more than ``early_stopping_min_delta`` below its best so far, or
        another monitored score (an accuracy) rises above its best. Monitoring ``("val_loss", "val_accuracy")``
        with a ``min_delta`` stops easy data early: once the accuracy stops rising (at 1.0 it cannot), a
        validation loss that still creeps down no longer keeps training going.
    early_stopping_ceiling_patience
        With a monitored accuracy at its ceiling (1.0: every validation cell right), stop after this many epochs
        without progress instead of ``early_stopping_patience`` (None: the same patience there). At the ceiling
        the accuracy cannot rise and a falling loss only widens margins (:class:`Plateau`), so waiting the full
        patience there only spends time.
    lr_schedule, warmup_fraction
        ``"constant"`` or ``"cosine"`` decay to 0 over the epochs, after a linear warm-up over ``warmup_fraction``
        of the steps (:func:`lr_factor`).
    num_workers
        DataLoader worker processes (``None``: :func:`loader_workers`, none).
    cuda_graphs
        Replay each training step as a CUDA graph, one per batch shape (:class:`cape._cuda_graphs.CapturedStep`): a
        small model's step is otherwise bound by the launch of its kernels. ``None``: on CUDA wherever it can
        (:func:`graphable`); ``False``: kernel by kernel.
    length_grouping
        Batch cells of similar token counts together, so that batches pad less
        (:class:`~cape.models.training.sampling.LengthGroupedShuffle`): each epoch's shuffled cells are sorted by
        length within pools of this many batches. ``None``: a plain seeded shuffle.
    """

    lr: float = 1e-3
    weight_decay: float = 0.01
    grad_clip: float | None = 1.0
    validation_fraction: float = 0.1
    early_stopping_patience: int | None = None
    early_stopping_metric: str = "val_loss"
    early_stopping_monitor: tuple[str, ...] = ()
    early_stopping_min_delta: float = 0.0
    early_stopping_ceiling_patience: int | None = None
    lr_schedule: str = "constant"
    warmup_fraction: float = 0.0
    num_workers: int | None = None
    cuda_graphs: bool | None = None
    length_grouping: int | None = 16


#: On CUDA batches are padded to a multiple of this many tokens (:func:`~cape.models.tokenize.pad_to_multiple`).
CUDA_PAD_MULTIPLE = 64


def loader_workers(num_workers: int | None) -> int:
    """DataLoader workers: ``num_workers`` as given, or (``None``) none.

    A batch is tokenised with array operations in the main process (:meth:`~cape.models.tokenize.CellDataset.
    __getitems__`), a small share of a step; workers are started afresh every epoch (each draws that epoch's genes
    and masks), and on the GPU machine measured that start cost more than the tokenising it took off the main
    process (docs/benchmarks/throughput.md). Large datasets, where an epoch is long, may gain from a few.
    """
    if num_workers is None:
        return 0
    if int(num_workers) != num_workers or num_workers < 0:
        raise CapeInputError(f"num_workers must be a whole number >= 0 (or None: none), got {num_workers}")
    return int(num_workers)


def cell_loader(data: Dataset, device: torch.device, pad_id: int, *, batch_size: int, num_workers: int | None = None,
                **kwargs) -> DataLoader:
    """A DataLoader of padded cell batches for ``device``: workers (:func:`loader_workers`), pinned memory and
    batches padded to a multiple of :data:`CUDA_PAD_MULTIPLE` tokens on CUDA."""
    cuda = device.type == "cuda"
    return DataLoader(data, batch_size=batch_size, collate_fn=CellCollator(pad_id, CUDA_PAD_MULTIPLE if cuda else 1),
                      num_workers=loader_workers(num_workers), pin_memory=cuda, **kwargs)


def _fused_adamw(params: list[Tensor]) -> bool:
    """Whether AdamW's fused kernel runs here: CUDA, or CPU from torch 2.4 (one pass over each parameter instead
    of about a dozen small kernels)."""
    device = params[0].device.type if params else "cpu"
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return device == "cuda" or (device == "cpu" and (major, minor) >= (2, 4))


@dataclass
class _GraphedSteps:
    """A training step captured as CUDA graphs: the batch's keys in the order the graphs take them, and the epoch's
    summed loss on the device."""

    keys: list[str]
    total: Tensor
    captured: CapturedStep | None = None


class _Step:
    """AdamW with gradient clipping, the plan's learning-rate schedule and (float16 autocast) a gradient scaler:
    one call per batch loss."""

    def __init__(self, task: nn.Module, plan: TrainingPlan, *, total_steps: int, scaled: bool,
                 capturable: bool = False) -> None:
        self.params = [p for p in task.parameters() if p.requires_grad]
        self.grad_clip = plan.grad_clip
        self.optimizer = torch.optim.AdamW(self.params, lr=plan.lr, weight_decay=plan.weight_decay,
                                           fused=_fused_adamw(self.params) or None, capturable=capturable)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_factor(step, total_steps, plan.lr_schedule, plan.warmup_fraction))
        self.scaler = torch.amp.GradScaler("cuda", enabled=scaled)
        self.graphed: _GraphedSteps | None = None

    def __call__(self, loss: Tensor) -> None:
        self.update(loss)
        self.scheduler.step()

    def update(self, loss: Tensor) -> None:
        """Backward, clipping and the AdamW update, without the schedule's step (which runs on the host)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.grad_clip:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()


def graphable(task: nn.Module, plan: TrainingPlan, device: torch.device, scaled: bool) -> bool:
    """Whether ``plan.cuda_graphs`` (``None``) replays the steps as CUDA graphs: on CUDA, one process, a constant
    learning rate (a captured step keeps the value it was captured with), no gradient scaler (float16 autocast: its
    step reads the device) and no module whose forward keeps per-step state on the host (Performer's redraws)."""
    if plan.cuda_graphs is False or device.type != "cuda" or distributed.is_active() or scaled:
        return False
    if plan.lr_schedule != "constant" or plan.warmup_fraction > 0:
        return False
    return not any(getattr(m, "feature_redraw_interval", None) for m in task.modules())


class Plateau:
    """Epochs since the monitored validation scores last made progress (:class:`TrainingPlan`'s
    ``early_stopping_monitor``): a score named ``*loss`` progresses when it falls more than ``min_delta`` below
    its best so far, any other score when it rises above its best. A best moves only on progress, so a loss that
    creeps down counts once its fall since then exceeds ``min_delta``. While a monitored score that is not a loss (an
    accuracy) is perfect (1.0), a falling loss is no progress: every validation cell is already right, and the loss
    can only go on shrinking the margins, so easy data stop ``patience`` epochs after reaching it."""

    def __init__(self, monitor: tuple[str, ...], min_delta: float = 0.0) -> None:
        self.monitor, self.min_delta = tuple(monitor), float(min_delta)
        self.best: dict[str, float] = {}
        self.bad_epochs = 0
        self.perfect = False  # whether the last epoch's monitored accuracy was at its ceiling

    def update(self, record: dict[str, float]) -> int:
        """Take one epoch's ``record``; returns the epochs without progress so far (0 after progress)."""
        missing = [name for name in self.monitor if name not in record]
        if missing:
            scores = ", ".join(k for k in record if k.startswith("val_"))
            raise CapeInputError(f"early_stopping_monitor names {', '.join(missing)}, not a validation score here "
                                 f"({scores})")
        progressed = False
        perfect = any(not name.endswith("loss") and record[name] >= 1.0 - 1e-9 for name in self.monitor)
        self.perfect = perfect
        for name in self.monitor:
            value, best = record[name], self.best.get(name)
            if name.endswith("loss"):
                better = best is None or (value < best - max(self.min_delta, 1e-6) and not perfect)
            else:
                better = best is None or value > best + 1e-6
            if better:
                self.best[name], progressed = value, True
        self.bad_epochs = 0 if progressed else self.bad_epochs + 1
        return self.bad_epochs


def stopping_patience(plan: TrainingPlan, plateau: Plateau | None) -> int | None:
    """The patience that applies after the latest epoch: ``early_stopping_ceiling_patience`` while a monitored
    accuracy sits at its ceiling (when both are set), else ``early_stopping_patience``."""
    patience, ceiling = plan.early_stopping_patience, plan.early_stopping_ceiling_patience
    if patience is None or ceiling is None or plateau is None or not plateau.perfect:
        return patience
    return min(patience, ceiling)


def _dataset_of(data: Dataset) -> CellDataset:
    return data.dataset if isinstance(data, Subset) else data


def token_lengths(data: Dataset) -> np.ndarray | None:
    """Tokens each cell of ``data`` pads to (its gene tokens within ``max_len``, plus ``<cls>``); None when the
    dataset does not say or every cell has as many."""
    dataset = _dataset_of(data)
    if not isinstance(dataset, CellDataset):
        return None
    lengths = dataset.tokens_per_cell()
    if isinstance(dataset.config.max_len, int | np.integer):
        lengths = np.minimum(lengths, int(dataset.config.max_len) - 1)
    if isinstance(data, Subset):
        lengths = lengths[np.asarray(data.indices)]
    return lengths + 1 if lengths.size and lengths.min() < lengths.max() else None


def train_sampler(train_set: Dataset, batch_size: int, seed: int, length_grouping: int | None
                  ) -> torch.utils.data.Sampler:
    """The training order: :class:`~cape.models.training.sampling.LengthGroupedShuffle` when ``length_grouping`` is
    set and the cells differ in length, else the seeded shuffle (``DistributedSampler`` under DDP)."""
    lengths = token_lengths(train_set) if length_grouping else None
    if lengths is not None:
        return LengthGroupedShuffle(lengths, batch_size, seed, pool_batches=length_grouping,
                                    num_replicas=distributed.world_size(), rank=distributed.rank())
    if distributed.is_active():
        return torch.utils.data.DistributedSampler(train_set, shuffle=True, seed=seed)
    return SeededShuffle(len(train_set), seed)


class Trainer:
    """Runs :class:`TrainingPlan` s on ``device`` (mixed precision with ``amp`` on CUDA), in a ``seed`` ed order.

    Parameters
    ----------
    device, amp
        Where the task runs; ``amp`` turns on autocast (bfloat16, else float16 with a gradient scaler) on CUDA.
    seed
        Seed of the batch order.
    pad_id
        Padding token of the collator.
    """

    def __init__(self, device: torch.device, amp: bool, seed: int, pad_id: int) -> None:
        self.device, self.amp, self.seed, self.pad_id = device, amp, seed, pad_id

    def autocast(self):
        if not self.amp or self.device.type != "cuda":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.autocast(device_type="cuda", dtype=dtype)

    def to_device(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def train(self, task: nn.Module, loss_fn: LossFn, train_set: Dataset, val_set: Dataset | None,
              plan: TrainingPlan, *, epochs: int, batch_size: int, desc: str = "train",
              score_fn: ScoreFn | None = None) -> list[dict[str, float]]:
        """Train ``task`` on ``loss_fn`` for at most ``epochs`` passes in batches of ``batch_size`` cells; score
        ``val_set`` each epoch and keep the best epoch's weights.

        ``score_fn(task, batch) -> {name: batch sum}`` gives the validation scores (default: ``val_loss`` from
        ``loss_fn``); ``plan.early_stopping_metric`` names the one that picks the best epoch. ``desc`` names the run
        in progress bars and logs. Returns the per-epoch history (``epoch``, ``train_loss``, ``seconds``,
        ``cells_per_s``, ``lr`` and the validation scores).
        """
        if epochs < 1:
            raise CapeInputError(f"epochs must be at least 1, got {epochs}")
        if batch_size < 1:
            raise CapeInputError(f"batch_size must be at least 1, got {batch_size}")
        if len(train_set) == 0:
            raise CapeInputError("no cells left for training")
        if plan.lr_schedule not in SCHEDULES:
            raise CapeInputError(f"unknown lr schedule {plan.lr_schedule!r}; choose from {', '.join(SCHEDULES)}")
        if not 0.0 <= plan.warmup_fraction < 1.0:
            raise CapeInputError(f"warmup_fraction must be in [0, 1), got {plan.warmup_fraction}")
        if not (math.isfinite(plan.early_stopping_min_delta) and plan.early_stopping_min_delta >= 0):
            raise CapeInputError(f"early_stopping_min_delta must be a finite number >= 0, "
                                 f"got {plan.early_stopping_min_delta}")
        ceiling = plan.early_stopping_ceiling_patience
        if ceiling is not None and not (isinstance(ceiling, int) and ceiling >= 1):
            raise CapeInputError(f"early_stopping_ceiling_patience must be a whole number >= 1 (or None), "
                                 f"got {ceiling}")
        check_length_grouping(plan.length_grouping)
        sampler = train_sampler(train_set, batch_size, self.seed, plan.length_grouping)
        loader = cell_loader(train_set, self.device, self.pad_id, batch_size=batch_size, sampler=sampler,
                             num_workers=plan.num_workers)
        model = task
        if distributed.is_active():
            # Some encodings leave parameters without gradient (e.g. TAPE's update after the last layer); DDP
            # must be told, and pays an extra graph traversal per step only then.
            unused = self.has_unused_parameters(task, loss_fn, next(iter(loader)))
            model = DistributedDataParallel(
                task, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=unused)
        val_loader = (cell_loader(val_set, self.device, self.pad_id, batch_size=batch_size, shuffle=False,
                                  num_workers=plan.num_workers) if val_set is not None and len(val_set) else None)
        if score_fn is None:
            def score_fn(m, batch):
                return {"val_loss": float(loss_fn(m, batch)) * batch["gene_ids"].shape[0]}
        scaled = self.amp and self.device.type == "cuda" and not torch.cuda.is_bf16_supported()
        graphs = graphable(task, plan, self.device, scaled)
        step = _Step(task, plan, total_steps=epochs * len(loader), scaled=scaled, capturable=graphs)
        if graphs:
            step.graphed = self._captured_step(model, loss_fn, step)
        history: list[dict[str, float]] = []
        best, best_state, bad_epochs = (math.inf, math.inf), None, 0
        plateau = Plateau(plan.early_stopping_monitor, plan.early_stopping_min_delta) \
            if plan.early_stopping_monitor else None
        bar = progress(range(epochs), desc=desc, total=epochs, unit="epoch")
        for epoch in bar:
            sampler.set_epoch(epoch)
            _dataset_of(train_set).set_epoch(epoch)
            record = self._epoch(model, loss_fn, loader, step, epoch)
            if val_loader is not None:
                # Every process scores the whole validation set: identical numbers, so early stopping agrees.
                # Validation cells share the training dataset object; score them with the same (epoch-0) gene
                # sampling and masks every epoch, so that validation losses are comparable across epochs.
                _dataset_of(val_set).set_epoch(0)
                record.update(self.evaluate(task, score_fn, val_loader))
                _dataset_of(train_set).set_epoch(epoch)
                # Lexicographic: the monitored score first (as a loss: lower is better), validation loss second.
                metric = plan.early_stopping_metric
                key = (record["val_loss"], 0.0) if metric == "val_loss" else (-record[metric], record["val_loss"])
                if key[0] < best[0] - 1e-6 or (abs(key[0] - best[0]) <= 1e-6 and key[1] < best[1] - 1e-6):
                    best, bad_epochs = key, 0
                    best_state = copy.deepcopy(task.state_dict())
                else:
                    bad_epochs += 1
                if plateau is not None:
                    bad_epochs = plateau.update(record)
            history.append(record)
            if hasattr(bar, "set_postfix"):
                bar.set_postfix({k: f"{v:.4g}" for k, v in record.items()
                                 if k.endswith("loss") or k == plan.early_stopping_metric or k == "val_accuracy"})
            logger.debug("%s epoch %d: %s", desc, epoch + 1, record)
            patience = stopping_patience(plan, plateau)
            if patience is not None and val_loader is not None and bad_epochs >= patience:
                logger.info("%s: early stop after epoch %d, %d without progress (best %s %.4f)", desc, epoch + 1,
                            bad_epochs, plan.early_stopping_metric, abs(best[0]))
                break
        bar.close()
        if step.graphed is not None:
            step.graphed.captured.release()
        if best_state is not None:
            task.load_state_dict(best_state)
        return history

    def _epoch(self, model: nn.Module, loss_fn: LossFn, loader: DataLoader, step: _Step, epoch: int
               ) -> dict[str, float]:
        """One pass over ``loader``: the record of epoch ``epoch`` (0-based) with ``train_loss`` (mean per cell over
        all processes), ``seconds``, ``cells_per_s`` and the ``lr`` after the epoch's last step."""
        model.train()
        start = time.perf_counter()
        # The loss is summed on the device and read once per epoch: reading it every step would make the host wait
        # for the GPU between steps.
        total, n_cells = torch.zeros((), dtype=torch.float64, device=self.device), 0
        graphed = step.graphed
        if graphed is not None:
            total = graphed.total.zero_()
        for batch in loader:
            batch = self.to_device(batch)
            b = batch["gene_ids"].shape[0]
            if graphed is not None:
                graphed.keys[:] = graphed.keys or sorted(batch)
                graphed.captured(*(batch[key] for key in graphed.keys))
                step.scheduler.step()
            else:
                with self.autocast():
                    loss = loss_fn(model, batch)
                step(loss)
                total += loss.detach().double() * b
            n_cells += b
        total = float(total)
        seconds = time.perf_counter() - start
        total, n_cells = distributed.all_reduce_sum([total, float(n_cells)], self.device)
        return {"epoch": epoch + 1, "train_loss": total / max(n_cells, 1), "seconds": seconds,
                "cells_per_s": n_cells / max(seconds, 1e-9), "lr": float(step.optimizer.param_groups[0]["lr"])}

    def _captured_step(self, model: nn.Module, loss_fn: LossFn, step: _Step) -> _GraphedSteps:
        """The training step (loss, backward, clipping, AdamW, the epoch's loss sum) for capture as CUDA graphs."""
        graphed = _GraphedSteps(keys=[], total=torch.zeros((), dtype=torch.float64, device=self.device))

        def run(*tensors: Tensor) -> tuple[Tensor, ...]:
            batch = dict(zip(graphed.keys, tensors, strict=True))
            with self.autocast():
                loss = loss_fn(model, batch)
            step.update(loss)
            graphed.total.add_(loss.detach().double() * batch["gene_ids"].shape[0])
            return (graphed.total,)

        graphed.captured = CapturedStep(run, name="training step")
        return graphed

    def has_unused_parameters(self, task: nn.Module, loss_fn: LossFn, batch: dict[str, Tensor]) -> bool:
        """One forward/backward in eval mode (no dropout draws, no Performer redraw count): does any trainable
        parameter get no gradient?"""
        was_training = task.training
        task.eval()
        task.zero_grad(set_to_none=True)
        with self.autocast():
            loss = loss_fn(task, self.to_device(batch))
        loss.backward()
        unused = any(p.requires_grad and p.grad is None for p in task.parameters())
        task.zero_grad(set_to_none=True)
        task.train(was_training)
        return unused

    @torch.no_grad()
    def evaluate(self, task: nn.Module, score_fn: ScoreFn, loader: DataLoader) -> dict[str, float]:
        """Per-cell means of ``score_fn``'s batch sums over ``loader``."""
        task.eval()
        totals: dict[str, float] = {}
        n = 0
        for batch in loader:
            batch = self.to_device(batch)
            with self.autocast():
                scores = score_fn(task, batch)
            for name, value in scores.items():
                totals[name] = totals.get(name, 0.0) + float(value)
            n += batch["gene_ids"].shape[0]
        return {name: value / max(n, 1) for name, value in totals.items()}
