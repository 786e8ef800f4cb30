"""Options of :class:`~cape.models.CellTransformer`, grouped: the network's shape (:class:`NetworkConfig`), the
tokenizer (:class:`~cape.models.TokenizerConfig`) and the cells it reads (:class:`~cape.models.InputConfig`), all
also given field by field as keywords; and the way the workflow and ``cape train`` train it
(:class:`TrainingRecipe`, :data:`DEFAULT_RECIPE`). How one call of ``pretrain``/``train`` optimises is a
:class:`~cape.models.TrainingPlan`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .._options import field_names
from .cells import InputConfig
from .modules.backbone import NetworkConfig
from .tokenize import AUTO, TokenizerConfig
from .training.engine import TrainingPlan

#: scGPT: 51 quantile bins; scBERT: log2 bins 0..5.
DEFAULT_BINNING = {"scgpt": ("quantile", 51), "scbert": ("log2", 5)}
#: ``integration`` when none is given (see :mod:`cape.models.modules.backbone`); chosen on validation accuracy
#: (docs/benchmarks/encodings.md).
DEFAULT_INTEGRATION = {"scgpt": "complement", "scbert": "complement"}
_TOKENIZER_FIELDS = ("binning", "n_bins", "max_len", "include_zero_genes")


@dataclass(frozen=True)
class TrainingRecipe:
    """How the workflow's ``train`` stage, ``cape train`` and :mod:`cape_benchmarks.recipe` train a backbone.

    Attributes
    ----------
    pretrain_epochs, pretrain_lr, cell_weight, pretrain_patience
        Self-supervised pretraining on every cell, labelled or not (:meth:`CellTransformer.pretrain
        <cape.models.CellTransformer.pretrain>`): masked values plus, with weight ``cell_weight``, the ``<cls>``
        state's reconstruction of the whole expression profile, which gives the cell embedding its content.
        ``pretrain_patience`` None runs every epoch and keeps the best validation epoch: the validation loss
        plateaus for several epochs before the ``<cls>`` state starts to separate cells, and stopping on that
        plateau leaves an embedding without cell structure.
    fit_lr, epochs, fit_patience, fit_min_delta, fit_ceiling_patience
        Fine-tuning of the annotation head and backbone on the labelled cells: learning rate, most epochs, and
        early stopping after ``fit_patience`` epochs in which neither the validation accuracy rose nor the
        validation loss fell more than ``fit_min_delta`` below its best (:class:`~cape.models.TrainingPlan`'s
        ``early_stopping_monitor``), or after ``fit_ceiling_patience`` such epochs while the validation accuracy
        is 1.0 (``early_stopping_ceiling_patience``): easy data, whose accuracy reaches its ceiling early, stop
        early.
    dropout
        Dropout of the encoder (residual and feed-forward paths; scGPT fine-tunes with 0.2), as
        :attr:`NetworkConfig.dropout` has by default.
    max_len
        Tokens per cell including ``<cls>``; ``"auto"`` covers every expressed gene.
    batch_size
        Cells per step.
    """

    pretrain_epochs: int = 40
    pretrain_lr: float = 1e-3
    cell_weight: float = 1.0
    pretrain_patience: int | None = None
    fit_lr: float = 3e-4
    epochs: int = 100
    fit_patience: int = 15
    fit_min_delta: float = 0.01
    fit_ceiling_patience: int | None = 5
    dropout: float = NetworkConfig.dropout
    max_len: int | str = AUTO
    batch_size: int = 32


#: The recipe the workflow and ``cape train`` use by default (chosen in ``cape-bench recipe``; see the docs).
DEFAULT_RECIPE = TrainingRecipe()

#: Defaults of :meth:`CellTransformer.pretrain <cape.models.CellTransformer.pretrain>`: lr 1e-3 on a 10 % validation
#: split, early stopping after 5 epochs without a better validation loss.
PRETRAIN_PLAN = TrainingPlan(early_stopping_patience=5)
#: The validation scores whose progress keeps fine-tuning going.
FINE_TUNE_MONITOR = ("val_loss", "val_accuracy")
#: Defaults of :meth:`CellTransformer.train <cape.models.CellTransformer.train>`: the fine-tuning part of
#: :data:`DEFAULT_RECIPE` (lr 3e-4; stop after 15 epochs without progress in validation accuracy or loss, 5 once
#: the validation accuracy is 1.0) on a 20 % validation split, keeping the epoch of the lowest validation loss.
FINE_TUNE_PLAN = TrainingPlan(lr=DEFAULT_RECIPE.fit_lr, validation_fraction=0.2,
                              early_stopping_patience=DEFAULT_RECIPE.fit_patience,
                              early_stopping_monitor=FINE_TUNE_MONITOR,
                              early_stopping_min_delta=DEFAULT_RECIPE.fit_min_delta,
                              early_stopping_ceiling_patience=DEFAULT_RECIPE.fit_ceiling_patience)


def split_options(network: NetworkConfig | None, inputs: InputConfig | None, options: dict[str, Any]
                  ) -> tuple[NetworkConfig, InputConfig, dict[str, Any], dict[str, Any]]:
    """``network`` and ``inputs`` with their fields given by name in ``options``; the tokenizer fields; the other
    (backbone) options."""
    rest = dict(options)
    network = dataclasses.replace(network or NetworkConfig(),
                                  **{k: rest.pop(k) for k in list(rest) if k in field_names(NetworkConfig)})
    inputs = dataclasses.replace(inputs or InputConfig(),
                                 **{k: rest.pop(k) for k in list(rest) if k in field_names(InputConfig)})
    token_options = {k: rest.pop(k) for k in list(rest) if k in _TOKENIZER_FIELDS}
    return network, inputs, token_options, rest


def tokenizer_config(architecture: str, tokenizer: TokenizerConfig | None, options: dict[str, Any]
                      ) -> TokenizerConfig:
    """``tokenizer`` (default: the architecture's binning) with the fields given by name in ``options``."""
    if tokenizer is None:
        binning, n_bins = DEFAULT_BINNING[architecture]
        return TokenizerConfig(binning=options.get("binning") or binning, n_bins=options.get("n_bins") or n_bins,
                               max_len=options.get("max_len") or AUTO,
                               include_zero_genes=options.get("include_zero_genes", False))
    return dataclasses.replace(tokenizer, **{k: v for k, v in options.items() if v is not None})

