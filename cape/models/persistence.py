"""Save and load a :class:`~cape.models.CellTransformer` model directory.

A model directory holds ``config.json`` (architecture, backbone and tokenizer options, labels, pooling, seed,
training history), ``vocab.json`` (the gene vocabulary), ``model.pt`` (the state dict) and, when the encoding
uses them, ``positions.pt`` (the gene positions) and ``identity.pt`` (scBERT's static gene-embedding vectors in
``integration="complement"`` mode). Every key is required: a directory without one is refused as damaged.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .. import __version__
from .._errors import CapeInputError
from .._settings import resolve_device
from ..encodings import GenePositions
from . import distributed
from .tokenize import GeneVocab, TokenizerConfig

if TYPE_CHECKING:
    from .transformer import CellTransformer

CONFIG_FILE, WEIGHTS_FILE, VOCAB_FILE, POSITIONS_FILE = "config.json", "model.pt", "vocab.json", "positions.pt"
IDENTITY_FILE = "identity.pt"
_POSITION_FIELDS = ("vectors", "order", "has_position", "graph_distance", "vectors_are_angles", "angle_params",
                    "source")


def model_config(model: CellTransformer) -> dict[str, Any]:
    """The content of ``config.json``."""
    return {"cape_version": __version__, "architecture": model.architecture, "backbone": dict(model._backbone_kwargs),
            "tokenizer": asdict(model.tokenizer), "layer": model.layer, "use_raw": model.use_raw,
            "vocabulary": getattr(model, "vocabulary", "all"),
            "labels": model.labels, "label_key": model.label_key, "n_cls_layers": model.n_cls_layers,
            "pooling": model.pooling, "cell_head": bool(model.cell_objective),
            "seed": model.seed, "history": model.history, "strict_genes": getattr(model, "strict_genes", True),
            "value_scale": model._value_scale()}


def model_record(model: CellTransformer) -> dict[str, Any]:
    """Parameters, seed and training history in a form ``.h5ad`` can store (no None, histories columnar)."""
    cfg = model_config(model)
    cfg["n_parameters"] = int(sum(p.numel() for p in model.module.parameters()))
    cfg["device"] = str(model.device)
    if model.truncation is not None:
        cfg["truncation"] = dict(model.truncation)
    effective = getattr(model.backbone.encoding, "effective_options", None)
    if effective is not None:  # e.g. CAPE's scale and bands as applied, whichever way the angles arrived
        cfg["encoding_effective"] = effective()
    cfg["history"] = {task: {key: [r.get(key, np.nan) for r in rows] for key in rows[0]}
                      for task, rows in model.history.items() if rows}
    return h5_safe(json.loads(json.dumps(cfg, default=str)))


def h5_safe(value):
    """Drop None (h5py cannot store it) and turn lists of strings/numbers into arrays, recursively."""
    if isinstance(value, dict):
        return {k: h5_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return np.asarray(value, dtype=object) if value else np.zeros(0)
        return np.asarray([np.nan if v is None else v for v in value], dtype=float)
    return value


def save_model(model: CellTransformer, directory: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``model`` to ``directory`` (see :meth:`CellTransformer.save <cape.models.CellTransformer.save>`)."""
    target = Path(directory)
    if not distributed.is_main_process():
        return target
    if target.exists():
        if not target.is_dir():
            raise CapeInputError(f"{target} exists and is not a directory; choose another model directory")
        if any(target.iterdir()):
            if not overwrite:
                raise CapeInputError(f"model directory {target} already exists and is not empty; pass "
                                     "overwrite=True to replace it, or choose another directory")
            if not (target / CONFIG_FILE).exists():
                raise CapeInputError(f"{target} exists and is not a cape model directory; refusing to overwrite")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        (tmp / CONFIG_FILE).write_text(json.dumps(model_config(model), indent=2, default=str))
        model.vocab.to_json(tmp / VOCAB_FILE)
        state = {k: v.detach().cpu() for k, v in model.module.state_dict().items()}
        torch.save(state, tmp / WEIGHTS_FILE)
        for positions, name in ((model.positions, POSITIONS_FILE),
                                (getattr(model, "identity_positions", None), IDENTITY_FILE)):
            if positions is not None:
                torch.save({k: getattr(positions, k) for k in _POSITION_FIELDS}, tmp / name)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target


def load_model(cls: type[CellTransformer], directory: str | Path, adata=None, *,
               device: str = "auto") -> CellTransformer:
    """Read a model directory (see :meth:`CellTransformer.load <cape.models.CellTransformer.load>`)."""
    directory = Path(directory)
    if not (directory / CONFIG_FILE).is_file() or not (directory / WEIGHTS_FILE).is_file():
        raise CapeInputError(f"{directory} is not a cape model directory (no {CONFIG_FILE} / {WEIGHTS_FILE})")
    try:
        model = _restore(cls, directory, device)
    except (CapeInputError, MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as err:  # a damaged config/weights file surfaces as many exception types
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise CapeInputError(f"{directory} is a damaged cape model directory ({type(err).__name__}: {first}); "
                             "train it again") from err
    if adata is not None:
        model._gene_ids(model._expression(adata)[1])
    return model


def _restore(cls: type[CellTransformer], directory: Path, device: str) -> CellTransformer:
    cfg = json.loads((directory / CONFIG_FILE).read_text())
    model = cls.__new__(cls)
    model.architecture = cfg["architecture"]
    model.seed = int(cfg["seed"])
    model.layer, model.use_raw = cfg["layer"], bool(cfg["use_raw"])
    model.vocabulary = cfg["vocabulary"]
    model.vocab = GeneVocab.from_json(directory / VOCAB_FILE)
    model.tokenizer = TokenizerConfig(**cfg["tokenizer"])
    model.labels, model.label_key = cfg["labels"], cfg["label_key"]
    model.n_cls_layers = int(cfg["n_cls_layers"])
    model.pooling = cfg["pooling"]
    model.cell_objective = bool(cfg["cell_head"])
    model.truncation = None
    model.history = cfg["history"]
    model.strict_genes = bool(cfg["strict_genes"])
    model.value_scale = cfg["value_scale"]
    model._backbone_kwargs = cfg["backbone"]
    model.positions = model.identity_positions = None
    if (directory / POSITIONS_FILE).is_file():
        model.positions = GenePositions(**torch.load(directory / POSITIONS_FILE, weights_only=True))
    if (directory / IDENTITY_FILE).is_file():
        model.identity_positions = GenePositions(**torch.load(directory / IDENTITY_FILE, weights_only=True))
    model.device = distributed.device_for_rank(resolve_device(device))
    model.amp = model.device.type == "cuda"
    model._build()
    state = torch.load(directory / WEIGHTS_FILE, map_location=model.device, weights_only=True)
    model.module.load_state_dict(state)
    return model
