"""A :class:`~cape.models.CellTransformer` on disk: ``config.json``, ``vocab.json``, ``model.pt`` (state dict) and
``positions.pt`` in one directory, written atomically; and the record of a model that ``.h5ad`` files can store."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import __version__
from .._errors import CapeInputError
from .._settings import resolve_device
from ..encodings import GenePositions
from . import distributed
from .tokenize import GeneVocab, TokenizerConfig

CONFIG_FILE, WEIGHTS_FILE, VOCAB_FILE, POSITIONS_FILE = "config.json", "model.pt", "vocab.json", "positions.pt"


def model_config(model) -> dict[str, Any]:
    """What ``config.json`` holds: everything but the weights, the vocabulary and the positions."""
    kwargs = {k: v for k, v in model._backbone_kwargs.items()}
    return {"cape_version": __version__, "architecture": model.architecture, "backbone": kwargs,
            "tokenizer": asdict(model.tokenizer), "layer": model.layer, "use_raw": model.use_raw,
            "vocabulary": getattr(model, "vocabulary", "all"),
            "labels": model.labels, "label_key": model.label_key, "n_cls_layers": model.n_cls_layers,
            "pooling": model.pooling,
            "seed": model.seed, "history": model.history, "strict_genes": getattr(model, "strict_genes", True),
            "value_scale": model._value_scale()}


def model_record(model) -> dict[str, Any]:
    """Parameters, seed and training history in a form ``.h5ad`` can store (no None, histories columnar)."""
    cfg = model_config(model)
    cfg["n_parameters"] = int(sum(p.numel() for p in model.module.parameters()))
    cfg["device"] = str(model.device)
    cfg["history"] = {task: {key: [r.get(key, np.nan) for r in rows] for key in rows[0]}
                      for task, rows in model.history.items() if rows}
    return _h5_safe(json.loads(json.dumps(cfg, default=str)))


def save_model(model, directory: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``config.json``, ``vocab.json``, ``model.pt`` (state dict) and ``positions.pt`` to ``directory``;
    an existing model directory is replaced only with ``overwrite``.

    Written to a temporary folder first and renamed, so a failure leaves no partial model behind. Only the
    main process writes under DDP.
    """
    target = Path(directory)
    if not distributed.is_main_process():
        return target
    if target.exists():
        if not overwrite:
            raise CapeInputError(f"model directory {target} exists (overwrite=False)")
        if any(target.iterdir()) and not (target / CONFIG_FILE).exists():
            raise CapeInputError(f"{target} exists and is not a cape model directory; refusing to overwrite")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        (tmp / CONFIG_FILE).write_text(json.dumps(model_config(model), indent=2, default=str))
        model.vocab.to_json(tmp / VOCAB_FILE)
        state = {k: v.detach().cpu() for k, v in model.module.state_dict().items()}
        torch.save(state, tmp / WEIGHTS_FILE)
        if model.positions is not None:
            torch.save({k: getattr(model.positions, k) for k in
                        ("vectors", "order", "has_position", "graph_distance", "vectors_are_angles",
                         "source")}, tmp / POSITIONS_FILE)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target


def load_model(cls, directory: str | Path, adata=None, *, device: str = "auto"):
    """An instance of ``cls`` from a directory written by :func:`save_model`; with ``adata``, check that its genes
    match the vocabulary."""
    directory = Path(directory)
    if not (directory / CONFIG_FILE).is_file() or not (directory / WEIGHTS_FILE).is_file():
        raise CapeInputError(f"{directory} is not a cape model directory (no {CONFIG_FILE} / {WEIGHTS_FILE})")
    try:
        self = _load(cls, directory, device)
    except (CapeInputError, MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as err:  # a damaged config/weights file surfaces as many exception types
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise CapeInputError(f"{directory} is a damaged cape model directory ({type(err).__name__}: {first}); "
                             "train it again") from err
    if adata is not None:
        self._gene_ids(self._expression(adata)[1])
    return self


def _load(cls, directory: Path, device: str):
    cfg = json.loads((directory / CONFIG_FILE).read_text())
    self = cls.__new__(cls)
    self.architecture = cfg["architecture"]
    self.seed = int(cfg["seed"])
    self.layer, self.use_raw = cfg["layer"], bool(cfg["use_raw"])
    self.vocabulary = cfg.get("vocabulary", "all")  # models saved before the option kept every gene
    self.vocab = GeneVocab.from_json(directory / VOCAB_FILE)
    self.tokenizer = TokenizerConfig(**cfg["tokenizer"])
    self.labels, self.label_key = cfg["labels"], cfg["label_key"]
    self.n_cls_layers = int(cfg["n_cls_layers"])
    self.pooling = cfg.get("pooling", "cls")
    self.history = cfg.get("history", {})
    self.strict_genes = bool(cfg.get("strict_genes", True))
    self.value_scale = cfg.get("value_scale")
    self._backbone_kwargs = cfg["backbone"]
    self.positions = None
    if (directory / POSITIONS_FILE).is_file():
        self.positions = GenePositions(**torch.load(directory / POSITIONS_FILE, weights_only=True))
    self.device = distributed.device_for_rank(resolve_device(device))
    self.amp = self.device.type == "cuda"
    self._build()
    state = torch.load(directory / WEIGHTS_FILE, map_location=self.device, weights_only=True)
    self.module.load_state_dict(state)
    return self


def _h5_safe(value):
    """Drop None (h5py cannot store it) and turn lists of strings/numbers into arrays, recursively."""
    if isinstance(value, dict):
        return {k: _h5_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return np.asarray(value, dtype=object) if value else np.zeros(0)
        return np.asarray([np.nan if v is None else v for v in value], dtype=float)
    return value
