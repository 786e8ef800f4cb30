"""Transformer backbones for single cells with pluggable positional encodings.

Split by role, as scvi-tools splits ``module``, ``train`` and ``model``:

* :class:`CellTransformer` — the user-facing model (pretrain, train, predict, get_latent_representation, embed,
  save/load, from_scgpt), which owns its state; its options are grouped in :class:`NetworkConfig`,
  :class:`TokenizerConfig` and :class:`InputConfig`, each call of ``pretrain``/``train`` optimises as a
  :class:`TrainingPlan` says, and the way the workflow trains it by default is :class:`TrainingRecipe`
  (:mod:`cape.models.hyperparameters`, ``DEFAULT_RECIPE``);
* :mod:`cape.models.modules` — the torch modules: :class:`ScGPTBackbone`, :class:`ScBERTBackbone` (tensors in,
  hidden states out), attention, heads;
* :mod:`cape.models.training` — the training engine, the objectives and DDP under torchrun;
* beside the model: :mod:`~cape.models.tokenize` (gene vocabulary, binning, gene sampling, collators),
  :mod:`~cape.models.cells` (cells of an AnnData), :mod:`~cape.models.positions`
  (:class:`~cape.encodings.GenePositions` from AnnData keys), :mod:`~cape.models.persistence` (model directory
  files) and :func:`load_scgpt_checkpoint` (import a published scGPT checkpoint directory).
"""

from __future__ import annotations

from .cells import InputConfig
from .hyperparameters import TrainingRecipe
from .modules.backbone import NetworkConfig
from .modules.heads import CellExpressionDecoder, ClsDecoder, ExprDecoder
from .modules.scbert import ScBERTBackbone
from .modules.scgpt import ScGPTBackbone
from .positions import gene_positions, random_positions
from .scgpt_checkpoint import load_scgpt_checkpoint
from .tokenize import CellDataset, GeneVocab, TokenizerConfig, collate_cells, log2_bin, quantile_bin
from .training.engine import TrainingPlan
from .transformer import CellTransformer

__all__ = [
    "CellDataset",
    "CellExpressionDecoder",
    "CellTransformer",
    "ClsDecoder",
    "ExprDecoder",
    "GeneVocab",
    "InputConfig",
    "NetworkConfig",
    "ScBERTBackbone",
    "ScGPTBackbone",
    "TokenizerConfig",
    "TrainingPlan",
    "TrainingRecipe",
    "collate_cells",
    "gene_positions",
    "load_scgpt_checkpoint",
    "log2_bin",
    "quantile_bin",
    "random_positions",
]
