"""Transformer backbones for single cells with pluggable positional encodings.

* :class:`CellTransformer` — the user-facing model (pretrain, train, predict, get_latent_representation, embed,
  save/load), with its options grouped in :class:`NetworkConfig` and :class:`TokenizerConfig`, and the way it is
  trained by default in :class:`TrainingRecipe` (``cape.models.config.DEFAULT_RECIPE``);
* :class:`ScGPTBackbone`, :class:`ScBERTBackbone` — the torch cores (tensors in, hidden states out);
* :mod:`~cape.models.tokenize` — gene vocabulary, binning, gene sampling, collators;
* :mod:`~cape.models.positions` — :class:`~cape.encodings.GenePositions` from AnnData keys;
* :mod:`~cape.models.training` — the training engine; :mod:`~cape.models.objectives` — its losses;
* :mod:`~cape.models.persistence` — model directories;
* :mod:`~cape.models.distributed` — DDP under torchrun;
* :func:`load_scgpt_checkpoint` — import a published scGPT checkpoint directory.
"""

from __future__ import annotations

from .config import NetworkConfig, TrainingRecipe
from .heads import CellExpressionDecoder, ClsDecoder, ExprDecoder
from .positions import gene_positions, random_positions
from .scbert import ScBERTBackbone
from .scgpt import ScGPTBackbone
from .scgpt_checkpoint import load_scgpt_checkpoint
from .tokenize import CellDataset, GeneVocab, TokenizerConfig, collate_cells, log2_bin, quantile_bin
from .transformer import CellTransformer

__all__ = [
    "CellDataset",
    "CellExpressionDecoder",
    "CellTransformer",
    "ClsDecoder",
    "ExprDecoder",
    "GeneVocab",
    "NetworkConfig",
    "ScBERTBackbone",
    "ScGPTBackbone",
    "TokenizerConfig",
    "TrainingRecipe",
    "collate_cells",
    "gene_positions",
    "load_scgpt_checkpoint",
    "log2_bin",
    "quantile_bin",
    "random_positions",
]
