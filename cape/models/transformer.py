"""``CellTransformer``: a single-cell transformer with a chosen positional encoding, used like an scvi-tools model.

>>> model = cape.models.CellTransformer(adata, architecture="scgpt", encoding="cape")
>>> model.pretrain(adata, epochs=5)                  # masked value prediction on unlabelled cells
>>> model.fit(adata, label_key="cell_type")          # annotation head
>>> adata.obs["pred"] = model.predict(adata)
>>> model.embed(adata)                               # obsm["X_cape"], varm["cape_gene_embedding"]
>>> model.save("model_dir"); model = cape.models.CellTransformer.load("model_dir", adata)

Training runs on ``device="auto"`` (CUDA when present, with mixed precision), clips gradients, keeps the best
epoch on a validation split (early stopping), shows progress bars and is seeded. Under ``torchrun`` it trains
with DDP (:mod:`cape.models.distributed`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset

from .. import __version__
from .._errors import CapeInputError
from .._progress import progress
from .._settings import resolve_device, resolve_seed, seed_everything
from ..encodings import GenePositions
from . import distributed
from .heads import ClsDecoder, ExprDecoder, check_pooling, pool_cells, pooled_width
from .positions import gene_positions
from .scbert import ScBERTBackbone
from .scgpt import ScGPTBackbone
from .tokenize import CellCollator, CellDataset, GeneVocab, TokenizerConfig, n_value_levels

logger = logging.getLogger("cape")

ARCHITECTURES = {"scgpt": ScGPTBackbone, "scbert": ScBERTBackbone}
#: scGPT: 51 quantile bins; scBERT: log2 bins 0..5.
DEFAULT_BINNING = {"scgpt": ("quantile", 51), "scbert": ("log2", 5)}
_CONFIG_FILE, _WEIGHTS_FILE, _VOCAB_FILE, _POSITIONS_FILE = "config.json", "model.pt", "vocab.json", "positions.pt"
#: ``vocabulary=`` choices: the genes of Steps I–III (``var["cape_used"]``) or every gene of the AnnData.
VOCABULARIES = ("used", "all")


# ------------------------------------------------------------------------------------------------ task modules
class _MaskedValueTask(nn.Module):
    """Backbone + expression decoder → mean over cells of the per-cell masked loss (MSE or cross-entropy).

    Averaging per cell first makes the loss of a batch the mean of its cells' losses, so DDP's gradient average
    over equal shards equals single-process training on the union.
    """

    def __init__(self, backbone: nn.Module, head: ExprDecoder, value_scale: float = 1.0) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.value_scale = float(value_scale)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        hidden = self.backbone(batch["gene_ids"], batch["masked_values"], batch["padding_mask"])
        pred = self.head(hidden)
        mask = batch["mask"]
        target = batch["values"]
        if pred.ndim == 2:
            # Regress bins rescaled to [0, 1] (scGPT regresses 0..50 directly, which with gradient clipping
            # takes many steps just to reach the mean).
            target = target / self.value_scale
        if pred.ndim == 3:  # level logits
            per_token = nn.functional.cross_entropy(
                pred.float().flatten(0, 1), target.round().long().clamp(0, pred.shape[-1] - 1).flatten(),
                reduction="none").view_as(target)
        else:
            per_token = (pred.float() - target) ** 2
        per_cell = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return per_cell.mean()


class _ClassifierTask(nn.Module):
    def __init__(self, backbone: nn.Module, head: ClsDecoder, pooling: str = "cls") -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.pooling = pooling

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        hidden = self.backbone(batch["gene_ids"], batch["values"], batch["padding_mask"])
        return self.head(pool_cells(hidden, batch["padding_mask"], self.pooling))


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


SCHEDULES = ("constant", "cosine")
CLASS_WEIGHTS = (None, "balanced")


def balanced_class_weights(codes: np.ndarray, n_classes: int) -> np.ndarray:
    """``n / (k · n_c)`` per class over the classes present (scikit-learn's "balanced"); absent classes get 1."""
    counts = np.bincount(np.asarray(codes, dtype=np.int64), minlength=n_classes).astype(np.float64)
    present = counts > 0
    weights = np.ones(n_classes)
    weights[present] = counts.sum() / (present.sum() * counts[present])
    return weights


class _SeededShuffle(torch.utils.data.Sampler):
    """Single-process twin of ``DistributedSampler(shuffle=True, seed=seed)``: the same permutation per epoch."""

    def __init__(self, n: int, seed: int, shuffle: bool = True) -> None:
        self.n, self.seed, self.shuffle, self.epoch = n, seed, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if not self.shuffle:
            return iter(range(self.n))
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n


# ------------------------------------------------------------------------------------------------ the model
class CellTransformer:
    """scGPT- or scBERT-style transformer over the genes of each cell, with any positional encoding.

    Parameters
    ----------
    adata
        AnnData whose genes form the vocabulary; expression must be log-normalised and non-negative (``X``, a
        ``layer`` or ``.raw``). Positions for the encoding are read from its ``varm``/``varp``/``var`` keys.
    architecture
        ``"scgpt"`` (gene + value embedding, softmax SDPA attention, post-norm) or ``"scbert"`` (binned tokens,
        Performer attention; bias encodings are refused).
    encoding
        A name from :func:`cape.encodings.available`.
    layer, use_raw
        Where the expression is: ``adata.layers[layer]``, ``adata.raw.X`` or ``adata.X`` (default).
    d_model, n_heads, n_layers, d_ff, dropout
        Encoder shape. Defaults are CPU-sized; the paper uses 512/8/4 (scGPT) and 200 (scBERT).
    max_len
        Tokens per cell including ``<cls>``; cells with more expressed genes are subsampled (seeded).
    n_bins, binning
        Value binning; default 51 quantile bins (scGPT) or log2 bins 0..5 (scBERT).
    include_zero_genes
        Tokenise every gene, not only the expressed ones.
    gene_embedding
        Learnt per-gene embedding (default: on for scGPT, off for scBERT as in the originals).
    encoding_options
        Keyword arguments passed to the encoding.
    positions
        Explicit :class:`~cape.encodings.GenePositions` (rows = vocabulary); default: built from ``adata``.
    n_cls_layers
        Layers of the annotation head (scGPT: 3).
    vocabulary
        Which genes form the vocabulary (and are tokenised): ``"used"`` (default) the genes of Steps I–III,
        ``var["cape_used"]`` (e.g. the highly variable genes), so that embeddings, positions and every
        genes × genes diagnostic scale with the genes in play, not with the 30,000-odd genes of a raw matrix;
        ``"all"`` every gene of the expression matrix. Without ``var["cape_used"]``, ``"used"`` falls back to all
        genes (with a log line). Other genes of the AnnData are left out of the cells' tokens.
    device
        ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``...
    amp
        Mixed precision: ``"auto"`` = on for CUDA.
    seed
        Seed of initialisation, splits, gene sampling and masking (default ``cape.settings.seed``).
    backbone_options
        Further backbone keywords (e.g. ``n_features`` and ``feature_redraw_interval`` for scBERT).
    """

    def __init__(self, adata, architecture: str = "scgpt", encoding: str = "cape", *, layer: str | None = None,
                 use_raw: bool = False, d_model: int = 64, n_heads: int = 4, n_layers: int = 2,
                 d_ff: int | None = None, dropout: float = 0.1, max_len: int = 256, n_bins: int | None = None,
                 binning: str | None = None, include_zero_genes: bool = False, gene_embedding: bool | None = None,
                 encoding_options: dict[str, Any] | None = None, positions: GenePositions | None = None,
                 n_cls_layers: int = 3, device: str = "auto", amp: bool | str = "auto", seed: int | None = None,
                 vocabulary: str = "used", **backbone_options: Any) -> None:
        if architecture not in ARCHITECTURES:
            raise CapeInputError(f"unknown architecture {architecture!r}; choose from {sorted(ARCHITECTURES)}")
        if vocabulary not in VOCABULARIES:
            raise CapeInputError(f"unknown vocabulary {vocabulary!r}; choose from {', '.join(VOCABULARIES)}")
        self.seed = resolve_seed(seed)
        self.architecture = architecture
        self.layer, self.use_raw = layer, bool(use_raw)
        self.vocabulary = vocabulary
        X, var_names = self._expression(adata)
        self.vocab = GeneVocab.from_genes(self._vocabulary_genes(adata, var_names))
        default_binning, default_bins = DEFAULT_BINNING[architecture]
        self.tokenizer = TokenizerConfig(binning=binning or default_binning, n_bins=n_bins or default_bins,
                                         max_len=max_len, include_zero_genes=include_zero_genes)
        encoding_options = dict(encoding_options or {})
        if encoding == "static_absolute" and encoding_options.get("gene2vec_path") is not None and positions is None:
            # Read the gene2vec file once here: its vectors then travel in positions.pt, not as a path.
            from ..encodings.static_absolute import read_gene2vec

            positions = read_gene2vec(encoding_options.pop("gene2vec_path"), self.vocab.tokens)
        if positions is None:
            positions = gene_positions(self._position_source(adata), self.vocab, encoding,
                                       encoding_options=encoding_options, expression=X, max_dim=d_model)
        self.positions = positions
        self.n_cls_layers = int(n_cls_layers)
        self.pooling = "cls"
        self.labels: list[str] | None = None
        self.label_key: str | None = None
        self.history: dict[str, list[dict[str, float]]] = {}
        self._backbone_kwargs = dict(d_model=d_model, n_heads=n_heads, n_layers=n_layers, d_ff=d_ff,
                                     dropout=dropout, encoding=encoding, encoding_options=encoding_options,
                                     **backbone_options)
        if gene_embedding is not None:
            self._backbone_kwargs["gene_embedding"] = gene_embedding
        self.device = distributed.device_for_rank(resolve_device(device))
        self.amp = (self.device.type == "cuda") if amp == "auto" else bool(amp)
        self._build()

    # ---------------------------------------------------------------------------------------------- building
    def _build(self) -> None:
        seed_everything(self.seed)
        kwargs = dict(self._backbone_kwargs)
        if self.architecture == "scbert":
            kwargs.setdefault("n_levels", n_value_levels(self.tokenizer.binning, self.tokenizer.n_bins))
            kwargs.setdefault("seed", self.seed)
            kwargs.setdefault("cls_id", self.vocab.cls_id)
        self.backbone = ARCHITECTURES[self.architecture](len(self.vocab), self.vocab.pad_id,
                                                         positions=self.positions, **kwargs)
        levels = n_value_levels(self.tokenizer.binning, self.tokenizer.n_bins)
        # scGPT regresses the binned value; scBERT classifies the masked token's level.
        self.expr_head = ExprDecoder(self.backbone.d_model, 1 if self.architecture == "scgpt" else levels)
        self.cls_head = None if self.labels is None else ClsDecoder(
            self.backbone.d_model, len(self.labels), self.n_cls_layers,
            d_in=pooled_width(self.backbone.d_model, self.pooling))
        self.module = nn.ModuleDict({"backbone": self.backbone, "expr_head": self.expr_head})
        if self.cls_head is not None:
            self.module["cls_head"] = self.cls_head
        self.module.to(self.device)

    def _vocabulary_genes(self, adata, var_names: pd.Index) -> pd.Index:
        """The genes of the vocabulary, in the AnnData's order (see ``vocabulary`` in the class docstring)."""
        if self.vocabulary == "all":
            return var_names
        if "cape_used" not in adata.var:
            logger.info("var['cape_used'] not found: the vocabulary is all %d genes", len(var_names))
            return var_names
        used = adata.var_names[np.asarray(adata.var["cape_used"], dtype=bool)]
        genes = var_names[var_names.isin(used)]
        if len(genes) == 0:
            raise CapeInputError("var['cape_used'] marks none of the expression matrix's genes; run cape preprocess "
                                 "or use vocabulary='all'")
        logger.info("vocabulary: the %d genes of var['cape_used'] (of %d; vocabulary='all' keeps every gene)",
                    len(genes), len(var_names))
        return genes

    def _position_source(self, adata):
        # Positions live on the genes of the AnnData the expression comes from (.raw has its own var).
        return adata.raw.to_adata() if self.use_raw else adata

    def _expression(self, adata) -> tuple[Any, pd.Index]:
        if self.use_raw:
            if adata.raw is None:
                raise CapeInputError("use_raw=True but the AnnData has no .raw")
            X, names = adata.raw.X, adata.raw.var_names
        elif self.layer is not None:
            if self.layer not in adata.layers:
                raise CapeInputError(f"layer '{self.layer}' not in adata.layers ({', '.join(adata.layers) or 'none'})")
            X, names = adata.layers[self.layer], adata.var_names
        else:
            X, names = adata.X, adata.var_names
        if X is None:
            raise CapeInputError("the AnnData has no expression matrix")
        data = X.data if sp.issparse(X) else np.asarray(X)
        if data.size and np.nanmin(data) < 0:
            raise CapeInputError(
                "expression has negative values (scaled data?): give log-normalised counts via layer= or use_raw=True"
            )
        return X, names

    def _gene_ids(self, var_names) -> np.ndarray:
        n_unknown, n_absent = self.vocab.difference(var_names)
        if not getattr(self, "strict_genes", True):
            # Imported foundation-model vocabularies: keep the AnnData's genes that the vocabulary knows.
            if n_unknown == len(var_names):
                raise CapeInputError("none of the AnnData's genes is in the model's gene vocabulary")
            if n_unknown:
                logger.info("%d of %d genes are not in the model's vocabulary and are left out",
                            n_unknown, len(var_names))
            return self.vocab.lookup(var_names)
        if getattr(self, "vocabulary", "all") == "used":
            # A vocabulary of the used genes is a subset of the AnnData's genes: the others are not tokenised.
            if n_absent:
                raise CapeInputError(
                    f"gene vocabulary mismatch: {n_absent} of the model's {len(self.vocab.genes)} genes (its "
                    "vocabulary: the genes of var['cape_used']) are missing from the AnnData"
                )
            return self.vocab.lookup(var_names)
        if n_unknown or n_absent:
            raise CapeInputError(
                f"gene vocabulary mismatch: {n_unknown} of the AnnData's {len(var_names)} genes are not in the "
                f"model's vocabulary and {n_absent} of the model's {len(self.vocab.genes)} genes are missing "
                "from the AnnData"
            )
        return self.vocab.lookup(var_names)

    def _dataset(self, adata, *, labels: np.ndarray | None = None, mask_ratio: float = 0.0) -> CellDataset:
        X, names = self._expression(adata)
        ids = self._gene_ids(names)
        known = np.flatnonzero(ids >= 0)
        if known.size < ids.size:
            # Keep only the vocabulary's columns: cells are tokenised over those genes alone, and a sparse matrix
            # stays sparse (never a dense cells × all-genes array).
            X, ids = X[:, known], ids[known]
        return CellDataset(X, ids, self.vocab, self.tokenizer, labels=labels, mask_ratio=mask_ratio, seed=self.seed)

    def _split(self, n: int, validation_fraction: float, stratify: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        if not 0.0 <= validation_fraction < 1.0:
            raise CapeInputError(f"validation_fraction must be in [0, 1), got {validation_fraction}")
        n_val = round(validation_fraction * n)
        if n_val == 0:
            return np.arange(n), np.arange(0)
        from sklearn.model_selection import train_test_split

        ok_strata = stratify is not None and np.bincount(stratify).min(initial=2) >= 2 and n_val >= len(
            np.unique(stratify))
        train, val = train_test_split(np.arange(n), test_size=n_val, random_state=self.seed % (2**32),
                                      stratify=stratify if ok_strata else None)
        return np.sort(train), np.sort(val)

    # ---------------------------------------------------------------------------------------------- training
    def _autocast(self):
        if not self.amp or self.device.type != "cuda":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.autocast(device_type="cuda", dtype=dtype)

    def _to_device(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def _train(self, task: nn.Module, loss_fn, train_set, val_set, *, epochs: int, batch_size: int, lr: float,
               weight_decay: float, grad_clip: float | None, patience: int | None, desc: str,
               num_workers: int, schedule: str = "constant", warmup_fraction: float = 0.0, score_fn=None,
               monitor: str = "val_loss") -> list[dict[str, float]]:
        """Train ``task`` on ``loss_fn``; score ``val_set`` each epoch and keep the best epoch's weights.

        ``score_fn(task, batch) -> {name: batch sum}`` gives the validation scores (default: ``val_loss`` from
        ``loss_fn``); ``monitor`` names the one that picks the best epoch (``val_loss`` is minimised, any other
        score maximised with ``val_loss`` breaking ties).
        """
        if epochs < 1:
            raise CapeInputError(f"epochs must be at least 1, got {epochs}")
        if batch_size < 1:
            raise CapeInputError(f"batch_size must be at least 1, got {batch_size}")
        if len(train_set) == 0:
            raise CapeInputError("no cells left for training")
        if schedule not in SCHEDULES:
            raise CapeInputError(f"unknown lr schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
        if not 0.0 <= warmup_fraction < 1.0:
            raise CapeInputError(f"warmup_fraction must be in [0, 1), got {warmup_fraction}")
        collate = CellCollator(self.vocab.pad_id)
        if distributed.is_active():
            sampler = torch.utils.data.DistributedSampler(train_set, shuffle=True, seed=self.seed)
        else:
            sampler = _SeededShuffle(len(train_set), self.seed)
        loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler, collate_fn=collate,
                            num_workers=num_workers, pin_memory=self.device.type == "cuda")
        model = task
        if distributed.is_active():
            from torch.nn.parallel import DistributedDataParallel

            # Some encodings leave parameters without gradient (e.g. TAPE's update after the last layer); DDP
            # must be told, and pays an extra graph traversal per step only then.
            unused = self._has_unused_parameters(task, loss_fn, next(iter(loader)))
            model = DistributedDataParallel(
                task, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=unused)
        val_loader = (DataLoader(val_set, batch_size=batch_size, shuffle=False, collate_fn=collate,
                                 num_workers=num_workers) if val_set is not None and len(val_set) else None)
        params = [p for p in task.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        total_steps = epochs * len(loader)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_factor(step, total_steps, schedule, warmup_fraction))
        if score_fn is None:
            def score_fn(m, batch):
                return {"val_loss": float(loss_fn(m, batch)) * batch["gene_ids"].shape[0]}
        use_scaler = self.amp and self.device.type == "cuda" and not torch.cuda.is_bf16_supported()
        scaler = torch.amp.GradScaler("cuda", enabled=use_scaler)
        history: list[dict[str, float]] = []
        best, best_state, bad_epochs = (math.inf, math.inf), None, 0
        bar = progress(range(epochs), desc=desc, total=epochs)
        for epoch in bar:
            sampler.set_epoch(epoch)
            _dataset_of(train_set).set_epoch(epoch)
            model.train()
            start = time.perf_counter()
            total, n_cells = 0.0, 0
            for batch in loader:
                batch = self._to_device(batch)
                with self._autocast():
                    loss = loss_fn(model, batch)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                if grad_clip:
                    scaler.unscale_(optimizer)
                    nn.utils.clip_grad_norm_(params, grad_clip)
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                b = batch["gene_ids"].shape[0]
                total += float(loss.detach()) * b
                n_cells += b
            seconds = time.perf_counter() - start
            total, n_cells = distributed.all_reduce_sum([total, float(n_cells)], self.device)
            record = {"epoch": epoch + 1, "train_loss": total / max(n_cells, 1), "seconds": seconds,
                      "cells_per_s": n_cells / max(seconds, 1e-9), "lr": optimizer.param_groups[0]["lr"]}
            if val_loader is not None:
                # Every process scores the whole validation set: identical numbers, so early stopping agrees.
                # Validation cells share the training dataset object; score them with the same (epoch-0) gene
                # sampling and masks every epoch, so that validation losses are comparable across epochs.
                _dataset_of(val_set).set_epoch(0)
                record.update(self._evaluate(task, score_fn, val_loader))
                _dataset_of(train_set).set_epoch(epoch)
                # Lexicographic: the monitored score first (as a loss: lower is better), validation loss second.
                key = (record["val_loss"], 0.0) if monitor == "val_loss" else (-record[monitor], record["val_loss"])
                if key[0] < best[0] - 1e-6 or (abs(key[0] - best[0]) <= 1e-6 and key[1] < best[1] - 1e-6):
                    best, bad_epochs = key, 0
                    best_state = copy.deepcopy(task.state_dict())
                else:
                    bad_epochs += 1
            history.append(record)
            if hasattr(bar, "set_postfix"):
                bar.set_postfix({k: round(v, 4) for k, v in record.items() if k.endswith("loss")})
            logger.debug("%s epoch %d: %s", desc, epoch + 1, record)
            if patience is not None and val_loader is not None and bad_epochs >= patience:
                logger.info("%s: early stop after epoch %d (best %s %.4f)", desc, epoch + 1, monitor,
                            abs(best[0]))
                break
        if best_state is not None:
            task.load_state_dict(best_state)
        return history

    def _has_unused_parameters(self, task: nn.Module, loss_fn, batch: dict[str, Tensor]) -> bool:
        """One forward/backward in eval mode (no dropout draws, no Performer redraw count): does any trainable
        parameter get no gradient?"""
        was_training = task.training
        task.eval()
        task.zero_grad(set_to_none=True)
        with self._autocast():
            loss = loss_fn(task, self._to_device(batch))
        loss.backward()
        unused = any(p.requires_grad and p.grad is None for p in task.parameters())
        task.zero_grad(set_to_none=True)
        task.train(was_training)
        return unused

    @torch.no_grad()
    def _evaluate(self, task: nn.Module, score_fn, loader) -> dict[str, float]:
        """Per-cell means of ``score_fn``'s batch sums over ``loader``."""
        task.eval()
        totals: dict[str, float] = {}
        n = 0
        for batch in loader:
            batch = self._to_device(batch)
            with self._autocast():
                scores = score_fn(task, batch)
            for name, value in scores.items():
                totals[name] = totals.get(name, 0.0) + float(value)
            n += batch["gene_ids"].shape[0]
        return {name: value / max(n, 1) for name, value in totals.items()}

    def pretrain(self, adata, epochs: int = 10, mask_ratio: float = 0.15, *, batch_size: int = 32,
                 lr: float = 1e-3, weight_decay: float = 0.01, grad_clip: float | None = 1.0,
                 validation_fraction: float = 0.1, early_stopping_patience: int | None = 5,
                 num_workers: int = 0) -> list[dict[str, float]]:
        """Masked value prediction on (unlabelled) cells.

        A fraction ``mask_ratio`` of each cell's gene tokens has its value hidden (``MASK_VALUE``); the model
        predicts the binned value (scGPT: squared error on bins rescaled to [0, 1]) or the level (scBERT:
        cross-entropy) from the rest. The loss is averaged per cell, then over cells.

        Returns the per-epoch history (``train_loss``, ``val_loss``, ``seconds``, ``cells_per_s``), also kept in
        ``self.history["pretrain"]``. The weights of the best validation epoch are kept.
        """
        if not 0.0 < mask_ratio < 1.0:
            raise CapeInputError(f"mask_ratio must be in (0, 1), got {mask_ratio}")
        seed_everything(self.seed)
        data = self._dataset(adata, mask_ratio=mask_ratio)
        train_idx, val_idx = self._split(len(data), validation_fraction)
        task = _MaskedValueTask(self.backbone, self.expr_head, value_scale=self._value_scale())
        history = self._train(task, lambda m, b: m(b), Subset(data, train_idx),
                              Subset(data, val_idx) if len(val_idx) else None, epochs=epochs,
                              batch_size=batch_size, lr=lr, weight_decay=weight_decay, grad_clip=grad_clip,
                              patience=early_stopping_patience, desc="pretrain", num_workers=num_workers)
        self.history["pretrain"] = history
        return history

    def fit(self, adata, label_key: str, epochs: int = 100, *, batch_size: int = 32, lr: float = 1e-3,
            weight_decay: float = 0.01, grad_clip: float | None = 1.0, validation_fraction: float = 0.2,
            early_stopping_patience: int | None = 15, freeze_backbone: bool = False,
            num_workers: int = 0, class_weight: str | None = "balanced", pooling: str | None = None,
            lr_schedule: str = "constant", warmup_fraction: float = 0.0,
            early_stopping_metric: str = "val_loss", label_smoothing: float = 0.0) -> list[dict[str, float]]:
        """Train the annotation head (and, unless ``freeze_backbone``, the backbone) on ``obs[label_key]``.

        Cells with a missing label are left out. The validation split is stratified when every class has at
        least two cells; the weights of the best validation epoch (``early_stopping_metric``: ``"val_loss"``,
        ``"val_accuracy"`` or ``"val_balanced_accuracy"``) are kept.

        The defaults are the recipe chosen on validation cells carved out of pbmc68k_reduced's 30 % fine-tune
        split (never its test cells): up to 100 epochs with early stopping (patience 15) on a 20 % validation
        split, class-balanced cross-entropy and mean pooling of the gene tokens, constant lr 1e-3; with
        ``dropout=0`` in the constructor.

        Parameters
        ----------
        class_weight
            ``"balanced"`` weights each class's cross-entropy by ``n / (k · n_c)`` over the training cells, so rare
            cell types count as much as common ones (macro-F1); None: unweighted.
        pooling
            Cell embedding fed to the head: ``"cls"`` (scGPT), ``"mean"`` of the gene tokens, or ``"cls+mean"``.
            Default: the pooling of an existing head, else ``"mean"``. A change rebuilds the head; :meth:`embed`
            then uses the same pooling.
        lr_schedule, warmup_fraction
            ``"constant"`` or ``"cosine"`` decay to 0 over ``epochs``, after a linear warm-up over
            ``warmup_fraction`` of the steps (:func:`lr_factor`).
        label_smoothing
            Cross-entropy label smoothing.
        """
        if label_key not in adata.obs:
            raise CapeInputError(f"label key '{label_key}' not in adata.obs ({', '.join(map(str, adata.obs))})")
        raw = adata.obs[label_key]
        keep = np.flatnonzero(raw.notna().to_numpy())
        if keep.size < 2:
            raise CapeInputError(f"obs['{label_key}'] has fewer than two labelled cells")
        classes = sorted(pd.unique(raw.iloc[keep].astype(str)))
        if len(classes) < 2:
            raise CapeInputError(f"obs['{label_key}'] has a single class ({classes[0]!r}); need at least two")
        if class_weight not in CLASS_WEIGHTS:
            raise CapeInputError(f"class_weight must be None or 'balanced', got {class_weight!r}")
        monitors = ("val_loss", "val_accuracy", "val_balanced_accuracy")
        if early_stopping_metric not in monitors:
            raise CapeInputError(f"early_stopping_metric must be one of {', '.join(monitors)}, "
                                 f"got {early_stopping_metric!r}")
        if not 0.0 <= label_smoothing < 1.0:
            raise CapeInputError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        pooling = check_pooling(pooling or (self.pooling if self.cls_head is not None else "mean"))
        if self.labels != classes or pooling != self.pooling or self.cls_head is None:
            self.labels, self.pooling = classes, pooling
            seed_everything(self.seed)
            self.cls_head = ClsDecoder(self.backbone.d_model, len(classes), self.n_cls_layers,
                                       d_in=pooled_width(self.backbone.d_model, pooling)).to(self.device)
            self.module["cls_head"] = self.cls_head
        self.label_key = label_key
        codes = np.full(adata.n_obs, -1, dtype=np.int64)
        codes[keep] = pd.Categorical(raw.iloc[keep].astype(str), categories=classes).codes
        seed_everything(self.seed)
        data = self._dataset(adata, labels=codes)
        train_pos, val_pos = self._split(keep.size, validation_fraction, stratify=codes[keep])
        for p in self.backbone.parameters():
            p.requires_grad_(not freeze_backbone)
        task = _ClassifierTask(self.backbone, self.cls_head, pooling)
        weight = None
        if class_weight == "balanced":
            weight = torch.as_tensor(balanced_class_weights(codes[keep[train_pos]], len(classes)),
                                     dtype=torch.float32, device=self.device)

        def loss_fn(m, batch):
            return nn.functional.cross_entropy(m(batch).float(), batch["label"], weight=weight,
                                               label_smoothing=label_smoothing)

        def score_fn(m, batch):
            # Batch sums: the weighted loss as trained, plain accuracy, and per-class hits for balanced accuracy.
            logits = m(batch).float()
            y = batch["label"]
            loss = nn.functional.cross_entropy(logits, y, weight=weight, label_smoothing=label_smoothing)
            hits = (logits.argmax(-1) == y).float()
            return {"val_loss": float(loss) * y.shape[0], "val_accuracy": float(hits.sum()),
                    "val_balanced_accuracy": float((hits / val_class_counts[y]).sum()) * n_val / n_val_classes}

        val_codes = codes[keep[val_pos]]
        val_class_counts = torch.as_tensor(np.bincount(val_codes, minlength=len(classes)).clip(min=1),
                                           dtype=torch.float32, device=self.device)
        n_val, n_val_classes = len(val_pos), max(len(np.unique(val_codes)), 1)
        try:
            history = self._train(task, loss_fn, Subset(data, keep[train_pos]),
                                  Subset(data, keep[val_pos]) if len(val_pos) else None, epochs=epochs,
                                  batch_size=batch_size, lr=lr, weight_decay=weight_decay, grad_clip=grad_clip,
                                  patience=early_stopping_patience, desc="fit", num_workers=num_workers,
                                  schedule=lr_schedule, warmup_fraction=warmup_fraction, score_fn=score_fn,
                                  monitor=early_stopping_metric)
        finally:
            for p in self.backbone.parameters():
                p.requires_grad_(True)
        self.history["fit"] = history
        return history

    # ---------------------------------------------------------------------------------------------- inference
    @torch.no_grad()
    def _forward_all(self, adata, batch_size: int, fn) -> list:
        data = self._dataset(adata)
        loader = DataLoader(data, batch_size=batch_size, shuffle=False, collate_fn=CellCollator(self.vocab.pad_id))
        self.module.eval()
        out = []
        for batch in progress(loader, desc="inference"):
            batch = self._to_device(batch)
            with self._autocast():
                hidden = self.backbone(batch["gene_ids"], batch["values"], batch["padding_mask"])
            out.append(fn(hidden.float(), batch))
        return out

    def predict(self, adata, *, batch_size: int = 64, key_added: str | None = None,
                return_probabilities: bool = False):
        """Predicted labels (a categorical of the training classes), or ``(n_cells, n_classes)`` probabilities.

        With ``key_added``, also writes the labels to ``adata.obs[key_added]``.
        """
        if self.cls_head is None or self.labels is None:
            raise CapeInputError("the model has no annotation head: call fit(adata, label_key) first")
        parts = self._forward_all(adata, batch_size, lambda h, b: torch.softmax(
            self.cls_head(pool_cells(h, b["padding_mask"], self.pooling)).float(), -1).cpu())
        probs = torch.cat(parts).numpy()
        if return_probabilities:
            return probs
        labels = pd.Categorical.from_codes(probs.argmax(1), categories=self.labels)
        if key_added is not None:
            adata.obs[key_added] = pd.Categorical(np.asarray(labels), categories=self.labels)
        return labels

    def embed(self, adata, *, key_added: str = "X_cape", gene_key: str | None = "cape_gene_embedding",
              batch_size: int = 64, copy: bool = False, pooling: str | None = None):
        """Cell embeddings → ``obsm[key_added]``; gene embeddings → ``varm[gene_key]``.

        The cell embedding is read off the hidden states by ``pooling`` (:func:`~cape.models.heads.pool_cells`):
        by default the pooling the annotation head was fitted with, and the ``<cls>`` state before any fit.

        A gene's embedding is the mean of its contextual hidden states over the cells where it was tokenised
        (zeros for genes never tokenised); ``var[f"{gene_key}_n_cells"]`` counts those cells.
        Returns the AnnData when ``copy``, else None.
        """
        adata = adata.copy() if copy else adata
        n_vocab, d = len(self.vocab), self.backbone.d_model
        gene_sum = torch.zeros(n_vocab, d, dtype=torch.float64, device=self.device)
        gene_n = torch.zeros(n_vocab, dtype=torch.float64, device=self.device)

        def take(hidden: Tensor, batch: dict[str, Tensor]) -> Tensor:
            ids = batch["gene_ids"][:, 1:].reshape(-1)
            keep = ~batch["padding_mask"][:, 1:].reshape(-1)
            gene_sum.index_add_(0, ids[keep], hidden[:, 1:].reshape(-1, d)[keep].double())
            gene_n.index_add_(0, ids[keep], torch.ones_like(ids[keep], dtype=torch.float64))
            return pool_cells(hidden, batch["padding_mask"], pooling).cpu()

        pooling = check_pooling(pooling or self.pooling)
        cells = torch.cat(self._forward_all(adata, batch_size, take)).numpy().astype(np.float32)
        adata.obsm[key_added] = cells
        if gene_key is not None:
            mean = (gene_sum / gene_n.clamp(min=1)[:, None]).cpu().numpy().astype(np.float32)
            _, names = self._expression(adata)
            if self.use_raw:
                logger.info("gene embeddings not stored: use_raw genes are not adata.var_names")
            else:
                rows = self.vocab.lookup(names)
                known = rows >= 0  # genes outside an imported vocabulary get zeros and a count of 0
                table = np.zeros((len(rows), d), dtype=np.float32)
                table[known] = mean[rows[known]]
                counts = np.zeros(len(rows), dtype=np.int64)
                counts[known] = gene_n.cpu().numpy()[rows[known]].astype(np.int64)
                adata.varm[gene_key] = table
                adata.var[f"{gene_key}_n_cells"] = counts
        adata.uns.setdefault("cape", {})["model"] = self._record()
        return adata if copy else None

    def gene_embedding_table(self) -> pd.DataFrame | None:
        """The learnt (context-free) gene token embedding, genes × d (None without a gene embedding)."""
        emb = getattr(self.backbone, "encoder", None)
        weight = emb.embedding.weight if emb is not None else getattr(self.backbone, "gene_emb", None)
        weight = weight.weight if isinstance(weight, nn.Embedding) else weight
        if weight is None:
            return None
        ids = self.vocab.lookup(self.vocab.genes)
        return pd.DataFrame(weight.detach().cpu().numpy()[ids], index=self.vocab.genes)

    # ---------------------------------------------------------------------------------------------- persistence
    def _value_scale(self) -> float:
        """Regression unit of the expression decoder: bins / (levels − 1), or raw bins for imported scGPT."""
        scale = getattr(self, "value_scale", None)
        return float(scale) if scale else float(n_value_levels(self.tokenizer.binning, self.tokenizer.n_bins) - 1)

    def _config(self) -> dict[str, Any]:
        kwargs = {k: v for k, v in self._backbone_kwargs.items()}
        return {"cape_version": __version__, "architecture": self.architecture, "backbone": kwargs,
                "tokenizer": asdict(self.tokenizer), "layer": self.layer, "use_raw": self.use_raw,
                "vocabulary": getattr(self, "vocabulary", "all"),
                "labels": self.labels, "label_key": self.label_key, "n_cls_layers": self.n_cls_layers,
                "pooling": self.pooling,
                "seed": self.seed, "history": self.history, "strict_genes": getattr(self, "strict_genes", True),
                "value_scale": self._value_scale()}

    def _record(self) -> dict[str, Any]:
        """Parameters, seed and training history in a form ``.h5ad`` can store (no None, histories columnar)."""
        cfg = self._config()
        cfg["n_parameters"] = int(sum(p.numel() for p in self.module.parameters()))
        cfg["device"] = str(self.device)
        cfg["history"] = {task: {key: [r.get(key, np.nan) for r in rows] for key in rows[0]}
                          for task, rows in self.history.items() if rows}
        return _h5_safe(json.loads(json.dumps(cfg, default=str)))

    def save(self, directory: str | Path, *, overwrite: bool = True) -> Path:
        """Write ``config.json``, ``vocab.json``, ``model.pt`` (state dict) and ``positions.pt`` to ``directory``.

        Written to a temporary folder first and renamed, so a failure leaves no partial model behind. Only the
        main process writes under DDP.
        """
        target = Path(directory)
        if not distributed.is_main_process():
            return target
        if target.exists():
            if not overwrite:
                raise CapeInputError(f"model directory {target} exists (overwrite=False)")
            if any(target.iterdir()) and not (target / _CONFIG_FILE).exists():
                raise CapeInputError(f"{target} exists and is not a cape model directory; refusing to overwrite")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            (tmp / _CONFIG_FILE).write_text(json.dumps(self._config(), indent=2, default=str))
            self.vocab.to_json(tmp / _VOCAB_FILE)
            state = {k: v.detach().cpu() for k, v in self.module.state_dict().items()}
            torch.save(state, tmp / _WEIGHTS_FILE)
            if self.positions is not None:
                torch.save({k: getattr(self.positions, k) for k in
                            ("vectors", "order", "has_position", "graph_distance", "vectors_are_angles",
                             "source")}, tmp / _POSITIONS_FILE)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
        return target

    @classmethod
    def load(cls, directory: str | Path, adata=None, *, device: str = "auto") -> CellTransformer:
        """Load a model written by :meth:`save`; with ``adata``, check that its genes match the vocabulary."""
        directory = Path(directory)
        if not (directory / _CONFIG_FILE).is_file() or not (directory / _WEIGHTS_FILE).is_file():
            raise CapeInputError(f"{directory} is not a cape model directory (no {_CONFIG_FILE} / {_WEIGHTS_FILE})")
        try:
            self = cls._load(directory, device)
        except (CapeInputError, MemoryError, torch.OutOfMemoryError):
            raise
        except Exception as err:  # a damaged config/weights file surfaces as many exception types
            first = (str(err).strip().splitlines() or [""])[0][:200]
            raise CapeInputError(f"{directory} is a damaged cape model directory ({type(err).__name__}: {first}); "
                                 "train it again") from err
        if adata is not None:
            self._gene_ids(self._expression(adata)[1])
        return self

    @classmethod
    def _load(cls, directory: Path, device: str) -> CellTransformer:
        cfg = json.loads((directory / _CONFIG_FILE).read_text())
        self = cls.__new__(cls)
        self.architecture = cfg["architecture"]
        self.seed = int(cfg["seed"])
        self.layer, self.use_raw = cfg["layer"], bool(cfg["use_raw"])
        self.vocabulary = cfg.get("vocabulary", "all")  # models saved before the option kept every gene
        self.vocab = GeneVocab.from_json(directory / _VOCAB_FILE)
        self.tokenizer = TokenizerConfig(**cfg["tokenizer"])
        self.labels, self.label_key = cfg["labels"], cfg["label_key"]
        self.n_cls_layers = int(cfg["n_cls_layers"])
        self.pooling = cfg.get("pooling", "cls")
        self.history = cfg.get("history", {})
        self.strict_genes = bool(cfg.get("strict_genes", True))
        self.value_scale = cfg.get("value_scale")
        self._backbone_kwargs = cfg["backbone"]
        self.positions = None
        if (directory / _POSITIONS_FILE).is_file():
            self.positions = GenePositions(**torch.load(directory / _POSITIONS_FILE, weights_only=True))
        self.device = distributed.device_for_rank(resolve_device(device))
        self.amp = self.device.type == "cuda"
        self._build()
        state = torch.load(directory / _WEIGHTS_FILE, map_location=self.device, weights_only=True)
        self.module.load_state_dict(state)
        return self

    @classmethod
    def from_scgpt(cls, directory: str | Path, adata, *, encoding: str = "none",
                   encoding_options: dict[str, Any] | None = None, positions: GenePositions | None = None,
                   layer: str | None = None, use_raw: bool = False, max_len: int = 1200,
                   include_zero_genes: bool = False, dropout: float | None = None, device: str = "auto",
                   amp: bool | str = "auto", seed: int | None = None) -> CellTransformer:
        """A CellTransformer around a published scGPT checkpoint (:func:`load_scgpt_checkpoint`).

        The gene vocabulary is the checkpoint's; genes of ``adata`` outside it are left out (as scGPT does), and
        positions for ``encoding`` are read from ``adata`` for the genes it shares with the vocabulary. Continue
        with :meth:`pretrain` / :meth:`fit` / :meth:`embed`.
        """
        from .scgpt_checkpoint import load_scgpt_checkpoint

        if not Path(directory).is_dir():
            raise CapeInputError(f"scGPT checkpoint directory not found: {directory}")
        for name in ("args.json", "vocab.json", "best_model.pt"):
            if not (Path(directory) / name).is_file():
                raise CapeInputError(f"scGPT checkpoint directory {directory} lacks {name}")
        self = cls.__new__(cls)
        self.seed = resolve_seed(seed)
        self.architecture = "scgpt"
        self.layer, self.use_raw = layer, bool(use_raw)
        self.strict_genes = False
        self.vocabulary = "checkpoint"
        self.value_scale = 1.0  # scGPT's decoder regresses the raw bins
        self.vocab = GeneVocab.from_json(Path(directory) / "vocab.json")
        X, _ = self._expression(adata)
        encoding_options = dict(encoding_options or {})
        if positions is None:
            positions = gene_positions(self._position_source(adata), self.vocab, encoding,
                                       encoding_options=encoding_options, expression=X)
        imported = load_scgpt_checkpoint(directory, encoding=encoding, encoding_options=encoding_options,
                                         positions=positions, dropout=dropout)
        args = imported.args
        self.tokenizer = TokenizerConfig(binning="quantile", n_bins=int(args.get("n_bins", 51)), max_len=max_len,
                                         include_zero_genes=include_zero_genes)
        self.positions = positions
        self.n_cls_layers = int(args.get("n_layers_cls", 3))
        self.pooling = "cls"
        self.labels, self.label_key, self.history = None, None, {}
        bb = imported.backbone
        self._backbone_kwargs = dict(d_model=bb.d_model, n_heads=bb.n_heads, n_layers=bb.n_layers, d_ff=bb.d_ff,
                                     dropout=bb.dropout_p, encoding=encoding, encoding_options=encoding_options)
        self.device = distributed.device_for_rank(resolve_device(device))
        self.amp = (self.device.type == "cuda") if amp == "auto" else bool(amp)
        self._build()
        self.backbone.load_state_dict(bb.state_dict())
        if imported.decoder is not None:
            self.expr_head.load_state_dict(imported.decoder.state_dict())
        self._gene_ids(self._expression(adata)[1])  # fails early when no gene overlaps
        return self

    def __repr__(self) -> str:
        n = sum(p.numel() for p in self.module.parameters())
        return (f"CellTransformer({self.architecture}, encoding={self.backbone.encoding_name!r}, "
                f"{len(self.vocab.genes)} genes, d_model={self.backbone.d_model}, {n:,} parameters, "
                f"device={self.device})")


def _dataset_of(data) -> CellDataset:
    return data.dataset if isinstance(data, Subset) else data


def _h5_safe(value):
    """Drop None (h5py cannot store it) and turn lists of strings/numbers into arrays, recursively."""
    if isinstance(value, dict):
        return {k: _h5_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return np.asarray(value, dtype=object) if value else np.zeros(0)
        return np.asarray([np.nan if v is None else v for v in value], dtype=float)
    return value
