"""``CellTransformer``: a single-cell transformer with a chosen positional encoding, used like an scvi-tools model.

>>> model = cape.models.CellTransformer(adata, architecture="scgpt", encoding="cape")
>>> model.pretrain(adata, epochs=5)                  # masked values + cell profiles, on unlabelled cells
>>> model.train(adata, label_key="cell_type")        # annotation head
>>> adata.obs["pred"] = model.predict(adata)
>>> model.embed(adata)                               # obsm["X_cape"], varm["cape_gene_embedding"]
>>> model.save("model_dir"); model = cape.models.CellTransformer.load("model_dir", adata)

The model owns its state: its torch modules (:mod:`cape.models.modules`), how it trains them
(:mod:`cape.models.training`: on ``device="auto"``, CUDA when present with mixed precision, gradient clipping, the
best epoch on a validation split kept, progress bars, seeded; DDP under ``torchrun``), its cells
(:class:`~cape.models.cells.CellData`), its model directory (:mod:`~cape.models.persistence` reads and writes the
files) and the import of scGPT checkpoints (:mod:`~cape.models.scgpt_checkpoint`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset

from .. import __version__
from .._errors import CapeInputError
from .._options import field_names, with_options
from .._progress import progress
from .._settings import resolve_device, resolve_seed, seed_everything
from ..encodings import GenePositions
from ..encodings.static_absolute import read_gene2vec
from . import persistence
from .cells import VOCABULARIES, CellData, InputConfig
from .hyperparameters import (
    DEFAULT_INTEGRATION,
    DEFAULT_RECIPE,
    FINE_TUNE_PLAN,
    PRETRAIN_PLAN,
    split_options,
    tokenizer_config,
)
from .modules.backbone import INTEGRATIONS, NetworkConfig
from .modules.heads import CellExpressionDecoder, ClsDecoder, ExprDecoder, check_pooling, pool_cells, pooled_width
from .modules.scbert import ScBERTBackbone
from .modules.scgpt import ScGPTBackbone
from .persistence import ModelFiles, h5_safe
from .positions import co_expression_positions, gene_positions
from .scgpt_checkpoint import load_scgpt_checkpoint
from .tokenize import GeneVocab, TokenizerConfig, n_value_levels
from .training import distributed
from .training.engine import Trainer, TrainingPlan, cell_loader, validation_split
from .training.objectives import (
    ClassifierTask,
    PretrainingTask,
    balanced_class_weights,
    check_classifier_options,
    classifier_objective,
    encode_labels,
    pretraining_loss,
)

logger = logging.getLogger("cape")

ARCHITECTURES = {"scgpt": ScGPTBackbone, "scbert": ScBERTBackbone}


class CellTransformer(CellData):
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
    network
        Encoder and head shape (:class:`NetworkConfig`).
    tokenizer
        Value binning and tokens per cell (:class:`~cape.models.TokenizerConfig`); default: 51 quantile bins
        (scGPT) or log2 bins 0..5 (scBERT), ``max_len="auto"`` (every expressed gene of ``adata``'s cells plus
        ``<cls>``, at most :data:`~cape.models.tokenize.MAX_AUTO_LEN`; cells with more are subsampled, seeded, with a
        warning), expressed genes only.
    encoding_options
        Keyword arguments passed to the encoding.
    positions
        Explicit :class:`~cape.encodings.GenePositions` (rows = vocabulary); default: built from ``adata``.
    identity_positions
        Vectors of scBERT's static gene embedding, kept beside the encoding with ``integration="complement"``
        (e.g. :func:`~cape.encodings.static_absolute.read_gene2vec`); default: co-expression vectors of ``adata``.
    inputs
        Where the expression is and which genes form the vocabulary (:class:`~cape.models.InputConfig`: ``layer``,
        ``use_raw``, ``vocabulary``; default: ``adata.X`` and the genes of ``var["cape_used"]``, all genes without
        it).
    device
        ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``...
    amp
        Mixed precision: ``"auto"`` = on for CUDA.
    seed
        Seed of initialisation, splits, gene sampling and masking (default ``cape.settings.seed``).
    **options
        Any field of :class:`NetworkConfig`, :class:`~cape.models.TokenizerConfig` or
        :class:`~cape.models.InputConfig` by name (``d_model=32``, ``max_len=128``, ``use_raw=True``...; they
        override ``network`` / ``tokenizer`` / ``inputs``); other keywords go to the backbone (e.g. ``n_features``
        and ``feature_redraw_interval`` for scBERT, ``attention_dropout`` for scGPT).
    """

    def __init__(self, adata, architecture: str = "scgpt", encoding: str = "cape", *,
                 network: NetworkConfig | None = None, tokenizer: TokenizerConfig | None = None,
                 inputs: InputConfig | None = None, encoding_options: dict[str, Any] | None = None,
                 positions: GenePositions | None = None, identity_positions: GenePositions | None = None,
                 device: str = "auto", amp: bool | str = "auto", seed: int | None = None, **options: Any) -> None:
        if architecture not in ARCHITECTURES:
            raise CapeInputError(f"unknown architecture {architecture!r}; choose from {sorted(ARCHITECTURES)}")
        network, inputs, token_options, options = split_options(network, inputs, options)
        if inputs.vocabulary not in VOCABULARIES:
            raise CapeInputError(f"unknown vocabulary {inputs.vocabulary!r}; choose from {', '.join(VOCABULARIES)}")
        self.seed = resolve_seed(seed)
        self.architecture = architecture
        self.layer, self.use_raw, self.vocabulary = inputs.layer, bool(inputs.use_raw), inputs.vocabulary
        # Only an imported vocabulary (from_scgpt) tolerates genes it does not know, and regresses raw bins.
        self.strict_genes, self.value_scale = True, None
        X, var_names = self.expression(adata)
        self.vocab = GeneVocab.from_genes(self._vocabulary_genes(adata, var_names))
        self.tokenizer = tokenizer_config(architecture, tokenizer, token_options)
        encoding_options = dict(encoding_options or {})
        if encoding == "static_absolute" and encoding_options.get("gene2vec_path") is not None and positions is None:
            # Read the gene2vec file once here: its vectors then travel in positions.pt, not as a path.
            positions = read_gene2vec(encoding_options.pop("gene2vec_path"), self.vocab.tokens)
        if positions is None:
            positions = gene_positions(self._position_source(adata), self.vocab, encoding,
                                       encoding_options=encoding_options, expression=X, max_dim=network.d_model)
        self.positions = positions
        integration = network.integration or DEFAULT_INTEGRATION[architecture]
        if integration not in INTEGRATIONS:
            raise CapeInputError(f"integration must be one of {', '.join(INTEGRATIONS)}, got {integration!r}")
        if (identity_positions is None and integration == "complement" and encoding != "static_absolute"
                and ARCHITECTURES[architecture].identity_kind == "static"):
            # scBERT's gene2vec role, filled as static_absolute fills it: co-expression of the vocabulary's genes.
            identity_positions = co_expression_positions(self._position_source(adata), self.vocab, X,
                                                         "static_absolute", max_dim=network.d_model)
        self.identity_positions = identity_positions
        self.truncation: dict[str, float] | None = None
        self._resolve_max_len(adata)
        self.network = dataclasses.replace(network, integration=integration)
        self.encoding_name, self.encoding_options, self.backbone_options = encoding, encoding_options, options
        self._untrained_heads()
        self._place(distributed.device_for_rank(resolve_device(device)), amp)
        self._build()

    def _untrained_heads(self) -> None:
        """The state of the heads before any training: ``<cls>`` pooling, no cell-expression or annotation head."""
        self.pooling = "cls"
        self.cell_objective = False  # a cell-expression head exists once pretrain() has used it
        self.labels: list[str] | None = None
        self.label_key: str | None = None
        self.history: dict[str, list[dict[str, float]]] = {}

    def _place(self, device: torch.device, amp: bool | str) -> None:
        self.device = device
        self.amp = (self.device.type == "cuda") if amp == "auto" else bool(amp)

    def __repr__(self) -> str:
        net = self.network
        n_params = sum(p.numel() for p in self.module.parameters())
        trained = ", ".join(k for k in ("pretrain", "train") if k in self.history) or "untrained"
        return (f"CellTransformer({self.architecture}, encoding={self.encoding_name!r}, integration="
                f"{net.integration!r}, {len(self.vocab.genes)} genes, max_len={self.tokenizer.max_len}, "
                f"d_model={net.d_model}, n_layers={net.n_layers}, n_heads={net.n_heads}, dropout={net.dropout}, "
                f"{n_params:,} parameters, {self.device}; {trained})")

    def _build(self) -> None:
        seed_everything(self.seed)
        options = dict(self.backbone_options)
        if self.architecture == "scbert":
            options.setdefault("n_levels", n_value_levels(self.tokenizer.binning, self.tokenizer.n_bins))
            options.setdefault("seed", self.seed)
            options.setdefault("cls_id", self.vocab.cls_id)
        self.backbone = ARCHITECTURES[self.architecture](
            len(self.vocab), self.vocab.pad_id, network=self.network, encoding=self.encoding_name,
            encoding_options=self.encoding_options, positions=self.positions, identity=self.identity_positions,
            **options)
        levels = n_value_levels(self.tokenizer.binning, self.tokenizer.n_bins)
        # scGPT regresses the binned value; scBERT classifies the masked token's level.
        self.expr_head = ExprDecoder(self.backbone.d_model, 1 if self.architecture == "scgpt" else levels)
        self.cell_head = CellExpressionDecoder(self.backbone.d_model, len(self.vocab)) if self.cell_objective else None
        self.cls_head = None if self.labels is None else ClsDecoder(
            self.backbone.d_model, len(self.labels), self.network.n_cls_layers,
            d_in=pooled_width(self.backbone.d_model, self.pooling))
        self.module = nn.ModuleDict({"backbone": self.backbone, "expr_head": self.expr_head})
        if self.cell_head is not None:
            self.module["cell_head"] = self.cell_head
        if self.cls_head is not None:
            self.module["cls_head"] = self.cls_head
        self.module.to(self.device)

    # ---------------------------------------------------------------------------------------------- training
    def _trainer(self) -> Trainer:
        return Trainer(self.device, self.amp, self.seed, self.vocab.pad_id)

    def _autocast(self):
        return self._trainer().autocast()

    def _to_device(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return self._trainer().to_device(batch)

    def _split(self, n: int, validation_fraction: float, stratify: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        return validation_split(n, validation_fraction, self.seed, stratify)

    def pretrain(self, adata, epochs: int = 10, mask_ratio: float = 0.15, *, batch_size: int = 32,
                 cell_weight: float = 1.0, plan: TrainingPlan | None = None, **options: Any
                 ) -> list[dict[str, float]]:
        """Self-supervised pretraining on (unlabelled) cells: masked values and the cell's expression profile.

        A fraction ``mask_ratio`` of each cell's gene tokens has its value hidden (``MASK_VALUE``); the model
        predicts the binned value (scGPT: squared error on bins rescaled to [0, 1]) or the level (scBERT:
        cross-entropy) from the rest. With ``cell_weight > 0`` the ``<cls>`` state also predicts the binned value
        of every vocabulary gene, zeros included (:class:`~cape.models.modules.heads.CellExpressionDecoder`,
        scGPT's GEPC/MVC idea), so that the cell embedding (:meth:`get_latent_representation`) summarises the
        cell: masked values alone are solved from gene identity and leave ``<cls>`` without a gradient. Losses are
        averaged per cell, then over cells; the cell term is added with weight ``cell_weight`` (0: masked values
        only).

        ``plan`` (:class:`~cape.models.TrainingPlan`, default
        :data:`~cape.models.hyperparameters.PRETRAIN_PLAN`: AdamW lr 1e-3, weight decay 0.01, gradient clipping
        at 1, a 10 % validation split, early stopping after 5 epochs without a better validation loss) says how
        to optimise; ``**options`` are fields of it by name (``lr=3e-3``, ``early_stopping_patience=None``...).

        Returns the per-epoch history (``train_loss``, ``val_loss``, ``seconds``, ``cells_per_s``), also kept in
        ``self.history["pretrain"]``. The weights of the best validation epoch are kept.
        """
        plan = with_options(TrainingPlan, PRETRAIN_PLAN if plan is None else plan, options, "pretrain")
        if not 0.0 < mask_ratio < 1.0:
            raise CapeInputError(f"mask_ratio must be in (0, 1), got {mask_ratio}")
        if not (np.isfinite(cell_weight) and cell_weight >= 0):
            raise CapeInputError(f"cell_weight must be a finite number >= 0, got {cell_weight}")
        if plan.early_stopping_metric != "val_loss":
            raise CapeInputError(f"pretraining is scored by val_loss alone, got {plan.early_stopping_metric!r}")
        seed_everything(self.seed)
        data = self._dataset(adata, mask_ratio=mask_ratio, cell_targets=cell_weight > 0)
        if cell_weight > 0 and self.cell_head is None:
            self.cell_objective = True
            self.cell_head = CellExpressionDecoder(self.backbone.d_model, len(self.vocab)).to(self.device)
            self.module["cell_head"] = self.cell_head
        train_idx, val_idx = self._split(len(data), plan.validation_fraction)
        task = PretrainingTask(self.backbone, self.expr_head, value_scale=self._value_scale(),
                               cell_head=self.cell_head if cell_weight > 0 else None, target_ids=data.target_ids,
                               cell_weight=cell_weight).to(self.device)
        history = self._trainer().train(task, pretraining_loss, Subset(data, train_idx),
                                        Subset(data, val_idx) if len(val_idx) else None, plan, epochs=epochs,
                                        batch_size=batch_size, desc="pretrain")
        self.history["pretrain"] = history
        return history

    def train(self, adata, label_key: str, epochs: int = DEFAULT_RECIPE.epochs, *, batch_size: int = 32,
              plan: TrainingPlan | None = None, freeze_backbone: bool = False, class_weight: str | None = "balanced",
              pooling: str | None = None, label_smoothing: float = 0.0, **options: Any) -> list[dict[str, float]]:
        """Train the annotation head (and, unless ``freeze_backbone``, the backbone) on ``obs[label_key]``.

        Cells with a missing label are left out. The validation split is stratified when every class has at
        least two cells; the weights of the best validation epoch (``early_stopping_metric``: ``"val_loss"``,
        ``"val_accuracy"`` or ``"val_balanced_accuracy"``) are kept. Returns the per-epoch history, also kept in
        ``self.history["train"]``.

        The defaults are :data:`~cape.models.hyperparameters.DEFAULT_RECIPE` (``cape-bench recipe`` compares it with
        the baselines): up to 100 epochs with early stopping (patience 15, 5 at validation accuracy 1.0) on a
        20 % validation split, class-balanced cross-entropy, mean pooling of the gene tokens and a constant lr of
        3e-4, after :meth:`pretrain` and with the constructor's ``dropout=0.2``.

        Parameters
        ----------
        plan, **options
            How to optimise (:class:`~cape.models.TrainingPlan`; default
            :data:`~cape.models.hyperparameters.FINE_TUNE_PLAN`: AdamW lr 3e-4, weight decay 0.01, gradient clipping
            at 1, a 20 % validation split, early stopping after 15 epochs without progress in ``val_loss`` or
            ``val_accuracy``, 5 at accuracy 1.0, constant lr) and any of its fields by name, overriding it
            (``lr=1e-3``, ``lr_schedule="cosine"``, ``warmup_fraction=0.1``,
            ``early_stopping_metric="val_balanced_accuracy"``...).
        class_weight
            ``"balanced"`` weights each class's cross-entropy by ``n / (k · n_c)`` over the training cells, so rare
            cell types count as much as common ones (macro-F1); None: unweighted.
        pooling
            Cell embedding fed to the head: ``"cls"`` (scGPT), ``"mean"`` of the gene tokens, or ``"cls+mean"``.
            Default: the pooling of an existing head, else ``"mean"``. A change rebuilds the head; :meth:`embed`
            then uses the same pooling.
        label_smoothing
            Cross-entropy label smoothing.
        """
        plan = with_options(TrainingPlan, FINE_TUNE_PLAN if plan is None else plan, options, "train")
        if label_key not in adata.obs:
            raise CapeInputError(f"label key '{label_key}' not in adata.obs ({', '.join(map(str, adata.obs))})")
        keep, classes, codes = encode_labels(adata.obs[label_key], label_key)
        check_classifier_options(class_weight, plan.early_stopping_metric, label_smoothing)
        pooling = check_pooling(pooling or (self.pooling if self.cls_head is not None else "mean"))
        if self.labels != classes or pooling != self.pooling or self.cls_head is None:
            self.labels, self.pooling = classes, pooling
            seed_everything(self.seed)
            self.cls_head = ClsDecoder(self.backbone.d_model, len(classes), self.network.n_cls_layers,
                                       d_in=pooled_width(self.backbone.d_model, pooling)).to(self.device)
            self.module["cls_head"] = self.cls_head
        self.label_key = label_key
        seed_everything(self.seed)
        data = self._dataset(adata, labels=codes)
        train_pos, val_pos = self._split(keep.size, plan.validation_fraction, stratify=codes[keep])
        for p in self.backbone.parameters():
            p.requires_grad_(not freeze_backbone)
        task = ClassifierTask(self.backbone, self.cls_head, pooling)
        weight = None
        if class_weight == "balanced":
            weight = torch.as_tensor(balanced_class_weights(codes[keep[train_pos]], len(classes)),
                                     dtype=torch.float32, device=self.device)
        loss_fn, score_fn = classifier_objective(weight, label_smoothing, codes[keep[val_pos]], len(classes),
                                                 self.device)
        try:
            history = self._trainer().train(task, loss_fn, Subset(data, keep[train_pos]),
                                            Subset(data, keep[val_pos]) if len(val_pos) else None, plan,
                                            epochs=epochs, batch_size=batch_size, desc="train", score_fn=score_fn)
        finally:
            for p in self.backbone.parameters():
                p.requires_grad_(True)
        self.history["train"] = history
        return history

    # ---------------------------------------------------------------------------------------------- inference
    def batches(self, adata, *, batch_size: int = 64) -> Iterator[dict[str, Tensor]]:
        """``adata``'s cells as this model tokenises them for inference (no masking), in order, in padded batches
        on the model's device (:func:`~cape.models.tokenize.collate_cells`: ``gene_ids``, ``values``,
        ``padding_mask``...). The caller chooses train or eval mode and gradients."""
        for batch in self._loader(adata, batch_size):
            yield self._to_device(batch)

    def _loader(self, adata, batch_size: int) -> DataLoader:
        return cell_loader(self._dataset(adata), self.device, self.vocab.pad_id, batch_size=batch_size, shuffle=False)

    @torch.no_grad()
    def _forward_all(self, adata, batch_size: int, fn: Callable[[Tensor, dict[str, Tensor]], Any]) -> list:
        """``fn(hidden states, batch)`` for the batches of ``adata``'s cells, in order, in eval mode."""
        loader = self._loader(adata, batch_size)
        self.module.eval()
        out = []
        for batch in progress(loader, desc="inference", lines=False):
            batch = self._to_device(batch)
            with self._autocast():
                hidden = self.backbone(batch["gene_ids"], batch["values"], batch["padding_mask"])
            out.append(fn(hidden.float(), batch))
        return out

    def _embeddings(self, adata, batch_size: int, pooling: str | None, genes: bool
                    ) -> tuple[np.ndarray, Tensor | None, Tensor | None]:
        """Cell embeddings and, with ``genes``, the per-gene sums and counts of contextual hidden states."""
        n_vocab, d = len(self.vocab), self.backbone.d_model
        gene_sum = torch.zeros(n_vocab, d, dtype=torch.float64, device=self.device) if genes else None
        gene_n = torch.zeros(n_vocab, dtype=torch.float64, device=self.device) if genes else None

        def take(hidden: Tensor, batch: dict[str, Tensor]) -> Tensor:
            if genes:
                ids = batch["gene_ids"][:, 1:].reshape(-1)
                keep = ~batch["padding_mask"][:, 1:].reshape(-1)
                gene_sum.index_add_(0, ids[keep], hidden[:, 1:].reshape(-1, d)[keep].double())
                gene_n.index_add_(0, ids[keep], torch.ones_like(ids[keep], dtype=torch.float64))
            return pool_cells(hidden, batch["padding_mask"], pooling).cpu()

        pooling = check_pooling(pooling or self.pooling)
        cells = torch.cat(self._forward_all(adata, batch_size, take)).numpy().astype(np.float32)
        return cells, gene_sum, gene_n

    def predict(self, adata, *, batch_size: int = 64, key_added: str | None = None,
                return_probabilities: bool = False):
        """Predicted labels (a categorical of the training classes), or ``(n_cells, n_classes)`` probabilities.

        With ``key_added``, also writes the labels to ``adata.obs[key_added]``.
        """
        if self.cls_head is None or self.labels is None:
            raise CapeInputError("the model has no annotation head: call train(adata, label_key) first")
        parts = self._forward_all(adata, batch_size, lambda h, b: torch.softmax(
            self.cls_head(pool_cells(h, b["padding_mask"], self.pooling)).float(), -1).cpu())
        probs = torch.cat(parts).numpy()
        if return_probabilities:
            return probs
        labels = pd.Categorical.from_codes(probs.argmax(1), categories=self.labels)
        if key_added is not None:
            adata.obs[key_added] = pd.Categorical(np.asarray(labels), categories=self.labels)
        return labels

    def get_latent_representation(self, adata, *, pooling: str | None = None, batch_size: int = 64) -> np.ndarray:
        """Cell embeddings, ``(n_cells, d)`` float32: the hidden states read off by ``pooling``.

        ``pooling`` (:func:`~cape.models.modules.heads.pool_cells`) defaults to the pooling the annotation head was
        trained with, and the ``<cls>`` state before any :meth:`train`. :meth:`embed` writes the same numbers.
        """
        return self._embeddings(adata, batch_size, pooling, genes=False)[0]

    def embed(self, adata, *, key_added: str = "X_cape", gene_key: str | None = "cape_gene_embedding",
              batch_size: int = 64, copy: bool = False, pooling: str | None = None):
        """Cell embeddings (:meth:`get_latent_representation`) → ``obsm[key_added]``; gene embeddings →
        ``varm[gene_key]``.

        A gene's embedding is the mean of its contextual hidden states over the cells where it was tokenised
        (zeros for genes never tokenised); ``var[f"{gene_key}_n_cells"]`` counts those cells.
        Returns the AnnData when ``copy``, else None.
        """
        adata = adata.copy() if copy else adata
        cells, gene_sum, gene_n = self._embeddings(adata, batch_size, pooling, genes=True)
        adata.obsm[key_added] = cells
        if gene_key is not None:
            self._write_gene_embedding(adata, gene_key, gene_sum, gene_n)
        adata.uns.setdefault("cape", {})["model"] = self._record()
        return adata if copy else None

    def _write_gene_embedding(self, adata, gene_key: str, gene_sum: Tensor, gene_n: Tensor) -> None:
        """Gene embeddings (mean hidden state over the cells where the gene was tokenised) → ``varm[gene_key]``,
        their cell counts → ``var[f"{gene_key}_n_cells"]``."""
        mean = (gene_sum / gene_n.clamp(min=1)[:, None]).cpu().numpy().astype(np.float32)
        _, names = self.expression(adata)
        if self.use_raw:
            logger.info("gene embeddings not stored: use_raw genes are not adata.var_names")
            return
        rows = self.vocab.lookup(names)
        known = rows >= 0  # genes outside an imported vocabulary get zeros and a count of 0
        table = np.zeros((len(rows), mean.shape[1]), dtype=np.float32)
        table[known] = mean[rows[known]]
        counts = np.zeros(len(rows), dtype=np.int64)
        counts[known] = gene_n.cpu().numpy()[rows[known]].astype(np.int64)
        adata.varm[gene_key] = table
        adata.var[f"{gene_key}_n_cells"] = counts

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
        if self.value_scale:
            return float(self.value_scale)
        return float(n_value_levels(self.tokenizer.binning, self.tokenizer.n_bins) - 1)

    def _backbone_config(self) -> dict[str, Any]:
        """The backbone's options as ``config.json`` keeps them: the network's shape and integration, the encoding
        and the architecture's own options."""
        net = self.network
        config = dict(d_model=net.d_model, n_heads=net.n_heads, n_layers=net.n_layers, d_ff=net.d_ff,
                      dropout=net.dropout, encoding=self.encoding_name, encoding_options=self.encoding_options,
                      integration=net.integration, **self.backbone_options)
        if net.gene_embedding is not None:
            config["gene_embedding"] = net.gene_embedding
        return config

    def _config(self) -> dict[str, Any]:
        """The content of ``config.json``."""
        return {"cape_version": __version__, "architecture": self.architecture, "backbone": self._backbone_config(),
                "tokenizer": dataclasses.asdict(self.tokenizer), "layer": self.layer, "use_raw": self.use_raw,
                "vocabulary": self.vocabulary, "labels": self.labels, "label_key": self.label_key,
                "n_cls_layers": self.network.n_cls_layers, "pooling": self.pooling,
                "cell_head": bool(self.cell_objective), "seed": self.seed, "history": self.history,
                "strict_genes": self.strict_genes, "value_scale": self._value_scale()}

    def _record(self) -> dict[str, Any]:
        """Parameters, seed and training history in a form ``.h5ad`` can store (no None, histories columnar)."""
        cfg = self._config()
        cfg["n_parameters"] = int(sum(p.numel() for p in self.module.parameters()))
        cfg["device"] = str(self.device)
        if self.truncation is not None:
            cfg["truncation"] = dict(self.truncation)
        effective = getattr(self.backbone.encoding, "effective_options", None)
        if effective is not None:  # e.g. CAPE's scale and bands as applied, whichever way the angles arrived
            cfg["encoding_effective"] = effective()
        cfg["history"] = {task: {key: [r.get(key, np.nan) for r in rows] for key in rows[0]}
                          for task, rows in self.history.items() if rows}
        return h5_safe(json.loads(json.dumps(cfg, default=str)))

    def save(self, directory: str | Path, *, overwrite: bool = False) -> Path:
        """Write ``config.json``, ``vocab.json``, ``model.pt`` (state dict) and ``positions.pt`` to ``directory``.

        An existing non-empty ``directory`` is refused unless ``overwrite`` (and even then when it is not a cape
        model directory). Written to a temporary folder first and renamed, so a failure leaves no partial model
        behind. Only the main process writes under DDP.
        """
        state = {k: v.detach().cpu() for k, v in self.module.state_dict().items()}
        files = ModelFiles(config=self._config(), vocab=self.vocab, state=state, positions=self.positions,
                           identity=self.identity_positions)
        return persistence.write_model(files, directory, overwrite=overwrite)

    @classmethod
    def load(cls, directory: str | Path, adata=None, *, device: str = "auto") -> CellTransformer:
        """Load a model written by :meth:`save`; with ``adata``, check that its genes match the vocabulary."""
        where = distributed.device_for_rank(resolve_device(device))
        model = persistence.read_model(directory, lambda files: cls._restore(files, where), where)
        if adata is not None:
            model._gene_ids(model.expression(adata)[1])
        return model

    @classmethod
    def _restore(cls, files: ModelFiles, device: torch.device) -> CellTransformer:
        """The model of a model directory's ``files`` (the inverse of :meth:`_config` and :meth:`save`)."""
        cfg = files.config
        self = cls.__new__(cls)
        self.architecture = cfg["architecture"]
        self.seed = int(cfg["seed"])
        self.layer, self.use_raw, self.vocabulary = cfg["layer"], bool(cfg["use_raw"]), cfg["vocabulary"]
        self.strict_genes, self.value_scale = bool(cfg["strict_genes"]), cfg["value_scale"]
        self.vocab = files.vocab
        self.tokenizer = TokenizerConfig(**cfg["tokenizer"])
        self.truncation = None
        self.positions, self.identity_positions = files.positions, files.identity
        backbone = dict(cfg["backbone"])
        self.encoding_name, self.encoding_options = backbone.pop("encoding"), backbone.pop("encoding_options")
        self.network = NetworkConfig(**{k: backbone.pop(k) for k in field_names(NetworkConfig) if k in backbone},
                                     n_cls_layers=int(cfg["n_cls_layers"]))
        self.backbone_options = backbone
        self.labels, self.label_key = cfg["labels"], cfg["label_key"]
        self.pooling = cfg["pooling"]
        self.cell_objective = bool(cfg["cell_head"])
        self.history = cfg["history"]
        self._place(device, "auto")
        self._build()
        self.module.load_state_dict(files.state)
        return self

    @classmethod
    def from_scgpt(cls, directory: str | Path, adata, *, encoding: str = "none",
                   encoding_options: dict[str, Any] | None = None, positions: GenePositions | None = None,
                   inputs: InputConfig | None = None, max_len: int | str = 1200, include_zero_genes: bool = False,
                   dropout: float | None = None, device: str = "auto", amp: bool | str = "auto",
                   seed: int | None = None, **options: Any) -> CellTransformer:
        """A CellTransformer around a published scGPT checkpoint (:func:`load_scgpt_checkpoint`).

        The gene vocabulary is the checkpoint's; genes of ``adata`` outside it are left out (as scGPT does), and
        positions for ``encoding`` are read from ``adata`` for the genes it shares with the vocabulary. The
        expression is read as ``inputs`` (or its fields by name in ``options``: ``layer``, ``use_raw``) say; their
        ``vocabulary`` is not read. The tokenizer is scGPT's quantile binning with the checkpoint's ``n_bins``,
        ``max_len`` tokens per cell and ``include_zero_genes``. Continue with :meth:`pretrain` / :meth:`train` /
        :meth:`embed`.
        """
        if not Path(directory).is_dir():
            raise CapeInputError(f"scGPT checkpoint directory not found: {directory}")
        for name in ("args.json", "vocab.json", "best_model.pt"):
            if not (Path(directory) / name).is_file():
                raise CapeInputError(f"scGPT checkpoint directory {directory} lacks {name}")
        if "vocabulary" in options:
            raise CapeInputError("from_scgpt: the vocabulary is the checkpoint's; vocabulary= does not apply")
        inputs = with_options(InputConfig, inputs, options, "from_scgpt")
        self = cls.__new__(cls)
        self.seed = resolve_seed(seed)
        self.architecture = "scgpt"
        self.layer, self.use_raw, self.vocabulary = inputs.layer, bool(inputs.use_raw), "checkpoint"
        self.strict_genes = False
        self.value_scale = 1.0  # scGPT's decoder regresses the raw bins
        self.vocab = GeneVocab.from_json(Path(directory) / "vocab.json")
        X, _ = self.expression(adata)
        encoding_options = dict(encoding_options or {})
        if positions is None:
            positions = gene_positions(self._position_source(adata), self.vocab, encoding,
                                       encoding_options=encoding_options, expression=X)
        imported = load_scgpt_checkpoint(directory, encoding=encoding, encoding_options=encoding_options,
                                         positions=positions, dropout=dropout)
        self.tokenizer = TokenizerConfig(binning="quantile", n_bins=int(imported.args.get("n_bins", 51)),
                                         max_len=max_len, include_zero_genes=include_zero_genes)
        self.truncation = None
        self._resolve_max_len(adata)
        self.positions = positions
        self.identity_positions = None  # scGPT's identity is its learnt gene table, imported with the weights
        self.network = imported.network
        self.encoding_name, self.encoding_options, self.backbone_options = encoding, encoding_options, {}
        self._untrained_heads()
        self._place(distributed.device_for_rank(resolve_device(device)), amp)
        self._build()
        self.backbone.load_state_dict(imported.backbone.state_dict())
        if imported.decoder is not None:
            self.expr_head.load_state_dict(imported.decoder.state_dict())
        self._gene_ids(self.expression(adata)[1])  # fails early when no gene overlaps
        return self
