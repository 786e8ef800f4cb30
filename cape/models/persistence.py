"""The model directory of a :class:`~cape.models.CellTransformer`: its files, written and read.

A model directory holds ``config.json`` (architecture, backbone and tokenizer options, labels, pooling, seed,
training history), ``vocab.json`` (the gene vocabulary), ``model.pt`` (the state dict) and, when the encoding
uses them, ``positions.pt`` (the gene positions) and ``identity.pt`` (scBERT's static gene-embedding vectors in
``integration="complement"`` mode). Every key is required: a directory without one is refused as damaged.

This module knows the files; the model knows its state (``CellTransformer.save``/``load`` turn one into the other
through :class:`ModelFiles`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from .._errors import CapeInputError
from ..encodings import GenePositions
from .tokenize import GeneVocab
from .training import distributed

CONFIG_FILE, WEIGHTS_FILE, VOCAB_FILE, POSITIONS_FILE = "config.json", "model.pt", "vocab.json", "positions.pt"
IDENTITY_FILE = "identity.pt"
_POSITION_FIELDS = ("vectors", "order", "has_position", "graph_distance", "vectors_are_angles", "angle_params",
                    "source")

T = TypeVar("T")


@dataclass
class ModelFiles:
    """The content of a model directory.

    Attributes
    ----------
    config
        ``config.json``.
    vocab
        ``vocab.json``.
    state
        ``model.pt``: the state dict of the model's modules (on the CPU when written; on the ``map_location`` given
        to :func:`read_model` when read).
    positions, identity
        ``positions.pt`` and ``identity.pt``, None when absent.
    """

    config: dict[str, Any]
    vocab: GeneVocab
    state: dict[str, torch.Tensor]
    positions: GenePositions | None = None
    identity: GenePositions | None = None


def h5_safe(value):
    """Drop None (h5py cannot store it) and turn lists of strings/numbers into arrays, recursively."""
    if isinstance(value, dict):
        return {k: h5_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return np.asarray(value, dtype=object) if value else np.zeros(0)
        return np.asarray([np.nan if v is None else v for v in value], dtype=float)
    return value


def write_model(files: ModelFiles, directory: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``files`` to ``directory`` (see :meth:`CellTransformer.save <cape.models.CellTransformer.save>`).

    An existing non-empty ``directory`` is refused unless ``overwrite`` (and even then when it is not a cape model
    directory). Written to a temporary folder first and renamed, so a failure leaves no partial model behind. Only
    the main process writes under DDP.
    """
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
        (tmp / CONFIG_FILE).write_text(json.dumps(files.config, indent=2, default=str))
        files.vocab.to_json(tmp / VOCAB_FILE)
        torch.save(files.state, tmp / WEIGHTS_FILE)
        for positions, name in ((files.positions, POSITIONS_FILE), (files.identity, IDENTITY_FILE)):
            if positions is not None:
                torch.save({k: getattr(positions, k) for k in _POSITION_FIELDS}, tmp / name)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target


def read_model(directory: str | Path, restore: Callable[[ModelFiles], T], map_location: torch.device) -> T:
    """``restore`` the model of ``directory`` from its files (weights onto ``map_location``).

    Any failure to read the files or to rebuild the model from them (a missing key, a weight of the wrong shape) is
    a :class:`~cape.CapeInputError` naming the directory as damaged.
    """
    directory = Path(directory)
    if not (directory / CONFIG_FILE).is_file() or not (directory / WEIGHTS_FILE).is_file():
        raise CapeInputError(f"{directory} is not a cape model directory (no {CONFIG_FILE} / {WEIGHTS_FILE})")
    try:
        return restore(_read_files(directory, map_location))
    except (CapeInputError, MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as err:  # a damaged config/weights file surfaces as many exception types
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise CapeInputError(f"{directory} is a damaged cape model directory ({type(err).__name__}: {first}); "
                             "train it again") from err


def _read_files(directory: Path, map_location: torch.device) -> ModelFiles:
    files = ModelFiles(config=json.loads((directory / CONFIG_FILE).read_text()),
                       vocab=GeneVocab.from_json(directory / VOCAB_FILE),
                       state=torch.load(directory / WEIGHTS_FILE, map_location=map_location, weights_only=True))
    if (directory / POSITIONS_FILE).is_file():
        files.positions = GenePositions(**torch.load(directory / POSITIONS_FILE, weights_only=True))
    if (directory / IDENTITY_FILE).is_file():
        files.identity = GenePositions(**torch.load(directory / IDENTITY_FILE, weights_only=True))
    return files
