"""``CellTransformer``: a single-cell transformer with a chosen positional encoding, used like an scvi-tools model.

>>> model = cape.models.CellTransformer(adata, architecture="scgpt", encoding="cape")
>>> model.pretrain(adata, epochs=5)                  # masked values + cell profiles, on unlabelled cells
>>> model.train(adata, label_key="cell_type")        # annotation head
>>> adata.obs["pred"] = model.predict(adata)
>>> model.embed(adata)                               # obsm["X_cape"], varm["cape_gene_embedding"]
>>> model.save("model_dir"); model = cape.models.CellTransformer.load("model_dir", adata)

Training (:mod:`~cape.models.training`) runs on ``device="auto"`` (CUDA when present, with mixed precision),
clips gradients, keeps the best epoch on a validation split (early stopping), shows progress bars and is seeded.
Under ``torchrun`` it trains with DDP (:mod:`cape.models.distributed`). Model directories:
:mod:`~cape.models.persistence`; scGPT checkpoints: :mod:`~cape.models.scgpt_checkpoint`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn
from torch.utils.data import Subset

from .._errors import CapeInputError
from .._settings import resolve_device, resolve_seed, seed_everything
from ..encodings import GenePositions
from ..encodings.static_absolute import read_gene2vec
from . import distributed, persistence, scgpt_checkpoint
from .backbone import INTEGRATIONS
from .cells import VOCABULARIES, CellData
from .config import DEFAULT_INTEGRATION, DEFAULT_RECIPE, NetworkConfig, split_options, tokenizer_config
from .heads import CellExpressionDecoder, ClsDecoder, ExprDecoder, check_pooling, pool_cells, pooled_width
from .inference import embeddings, forward_all, write_gene_embedding
from .objectives import (
    ClassifierTask,
    PretrainingTask,
    balanced_class_weights,
    check_classifier_options,
    classifier_objective,
    encode_labels,
    pretraining_loss,
)
from .positions import co_expression_positions, gene_positions
from .scbert import ScBERTBackbone
from .scgpt import ScGPTBackbone
from .tokenize import GeneVocab, TokenizerConfig, n_value_levels
from .training import Trainer, TrainingPlan, validation_split

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
    layer, use_raw
        Where the expression is: ``adata.layers[layer]``, ``adata.raw.X`` or ``adata.X`` (default).
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
    **options
        Any field of :class:`NetworkConfig` or :class:`~cape.models.TokenizerConfig` by name (``d_model=32``,
        ``max_len=128``, ``n_bins=...``; they override ``network`` / ``tokenizer``); other keywords go to the
        backbone (e.g. ``n_features`` and ``feature_redraw_interval`` for scBERT).
    """

    def __init__(self, adata, architecture: str = "scgpt", encoding: str = "cape", *,
                 network: NetworkConfig | None = None, tokenizer: TokenizerConfig | None = None,
                 encoding_options: dict[str, Any] | None = None, positions: GenePositions | None = None,
                 identity_positions: GenePositions | None = None,
                 layer: str | None = None, use_raw: bool = False, vocabulary: str = "used", device: str = "auto",
                 amp: bool | str = "auto", seed: int | None = None, **options: Any) -> None:
        if architecture not in ARCHITECTURES:
            raise CapeInputError(f"unknown architecture {architecture!r}; choose from {sorted(ARCHITECTURES)}")
        if vocabulary not in VOCABULARIES:
            raise CapeInputError(f"unknown vocabulary {vocabulary!r}; choose from {', '.join(VOCABULARIES)}")
        network, token_options, options = split_options(network, options)
        self.seed = resolve_seed(seed)
        self.architecture = architecture
        self.layer, self.use_raw = layer, bool(use_raw)
        self.vocabulary = vocabulary
        X, var_names = self._expression(adata)
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
        self.n_cls_layers = int(network.n_cls_layers)
        self.pooling = "cls"
        self.cell_objective = False  # a cell-expression head exists once pretrain() has used it
        self.labels: list[str] | None = None
        self.label_key: str | None = None
        self.history: dict[str, list[dict[str, float]]] = {}
        self._backbone_kwargs = dict(d_model=network.d_model, n_heads=network.n_heads, n_layers=network.n_layers,
                                     d_ff=network.d_ff, dropout=network.dropout, encoding=encoding,
                                     encoding_options=encoding_options, integration=integration, **options)
        if network.gene_embedding is not None:
            self._backbone_kwargs["gene_embedding"] = network.gene_embedding
        self.device = distributed.device_for_rank(resolve_device(device))
        self.amp = (self.device.type == "cuda") if amp == "auto" else bool(amp)
        self._build()

    def _build(self) -> None:
        seed_everything(self.seed)
        kwargs = dict(self._backbone_kwargs)
        if self.architecture == "scbert":
            kwargs.setdefault("n_levels", n_value_levels(self.tokenizer.binning, self.tokenizer.n_bins))
            kwargs.setdefault("seed", self.seed)
            kwargs.setdefault("cls_id", self.vocab.cls_id)
        self.backbone = ARCHITECTURES[self.architecture](len(self.vocab), self.vocab.pad_id,
                                                         positions=self.positions,
                                                         identity=getattr(self, "identity_positions", None),
                                                         **kwargs)
        levels = n_value_levels(self.tokenizer.binning, self.tokenizer.n_bins)
        # scGPT regresses the binned value; scBERT classifies the masked token's level.
        self.expr_head = ExprDecoder(self.backbone.d_model, 1 if self.architecture == "scgpt" else levels)
        self.cell_head = CellExpressionDecoder(self.backbone.d_model, len(self.vocab)) if self.cell_objective else None
        self.cls_head = None if self.labels is None else ClsDecoder(
            self.backbone.d_model, len(self.labels), self.n_cls_layers,
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
                 lr: float = 1e-3, weight_decay: float = 0.01, grad_clip: float | None = 1.0,
                 validation_fraction: float = 0.1, early_stopping_patience: int | None = 5,
                 num_workers: int = 0, cell_weight: float = 1.0) -> list[dict[str, float]]:
        """Self-supervised pretraining on (unlabelled) cells: masked values and the cell's expression profile.

        A fraction ``mask_ratio`` of each cell's gene tokens has its value hidden (``MASK_VALUE``); the model
        predicts the binned value (scGPT: squared error on bins rescaled to [0, 1]) or the level (scBERT:
        cross-entropy) from the rest. With ``cell_weight > 0`` the ``<cls>`` state also predicts the binned value
        of every vocabulary gene, zeros included (:class:`~cape.models.heads.CellExpressionDecoder`, scGPT's
        GEPC/MVC idea), so that the cell embedding (:meth:`get_latent_representation`) summarises the cell:
        masked values alone are solved from gene identity and leave ``<cls>`` without a gradient. Losses are
        averaged per cell, then over cells; the cell term is added with weight ``cell_weight`` (0: masked values
        only).

        Returns the per-epoch history (``train_loss``, ``val_loss``, ``seconds``, ``cells_per_s``), also kept in
        ``self.history["pretrain"]``. The weights of the best validation epoch are kept.
        """
        if not 0.0 < mask_ratio < 1.0:
            raise CapeInputError(f"mask_ratio must be in (0, 1), got {mask_ratio}")
        if not (np.isfinite(cell_weight) and cell_weight >= 0):
            raise CapeInputError(f"cell_weight must be a finite number >= 0, got {cell_weight}")
        seed_everything(self.seed)
        data = self._dataset(adata, mask_ratio=mask_ratio, cell_targets=cell_weight > 0)
        if cell_weight > 0 and self.cell_head is None:
            self.cell_objective = True
            self.cell_head = CellExpressionDecoder(self.backbone.d_model, len(self.vocab)).to(self.device)
            self.module["cell_head"] = self.cell_head
        train_idx, val_idx = self._split(len(data), validation_fraction)
        task = PretrainingTask(self.backbone, self.expr_head, value_scale=self._value_scale(),
                               cell_head=self.cell_head if cell_weight > 0 else None, target_ids=data.target_ids,
                               cell_weight=cell_weight).to(self.device)
        plan = TrainingPlan(epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                            grad_clip=grad_clip, patience=early_stopping_patience, desc="pretrain",
                            num_workers=num_workers)
        history = self._trainer().train(task, pretraining_loss, Subset(data, train_idx),
                                        Subset(data, val_idx) if len(val_idx) else None, plan)
        self.history["pretrain"] = history
        return history

    def train(self, adata, label_key: str, epochs: int = DEFAULT_RECIPE.epochs, *, batch_size: int = 32,
              lr: float = DEFAULT_RECIPE.fit_lr,
              weight_decay: float = 0.01, grad_clip: float | None = 1.0, validation_fraction: float = 0.2,
              early_stopping_patience: int | None = DEFAULT_RECIPE.fit_patience, freeze_backbone: bool = False,
              num_workers: int = 0, class_weight: str | None = "balanced", pooling: str | None = None,
              lr_schedule: str = "constant", warmup_fraction: float = 0.0,
              early_stopping_metric: str = "val_loss", label_smoothing: float = 0.0) -> list[dict[str, float]]:
        """Train the annotation head (and, unless ``freeze_backbone``, the backbone) on ``obs[label_key]``.

        Cells with a missing label are left out. The validation split is stratified when every class has at
        least two cells; the weights of the best validation epoch (``early_stopping_metric``: ``"val_loss"``,
        ``"val_accuracy"`` or ``"val_balanced_accuracy"``) are kept. Returns the per-epoch history, also kept in
        ``self.history["fit"]`` (the key of model directories saved before the method was named ``train``).

        The defaults are :data:`~cape.models.config.DEFAULT_RECIPE` (``cape-bench recipe`` compares it with the
        baselines): up to 100 epochs with early stopping (patience 15) on a 20 % validation split, class-balanced
        cross-entropy, mean pooling of the gene tokens and a constant lr of 3e-4, after :meth:`pretrain` and with
        the constructor's ``dropout=0.2``.

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
            ``warmup_fraction`` of the steps (:func:`~cape.models.training.lr_factor`).
        label_smoothing
            Cross-entropy label smoothing.
        """
        if label_key not in adata.obs:
            raise CapeInputError(f"label key '{label_key}' not in adata.obs ({', '.join(map(str, adata.obs))})")
        keep, classes, codes = encode_labels(adata.obs[label_key], label_key)
        check_classifier_options(class_weight, early_stopping_metric, label_smoothing)
        pooling = check_pooling(pooling or (self.pooling if self.cls_head is not None else "mean"))
        if self.labels != classes or pooling != self.pooling or self.cls_head is None:
            self.labels, self.pooling = classes, pooling
            seed_everything(self.seed)
            self.cls_head = ClsDecoder(self.backbone.d_model, len(classes), self.n_cls_layers,
                                       d_in=pooled_width(self.backbone.d_model, pooling)).to(self.device)
            self.module["cls_head"] = self.cls_head
        self.label_key = label_key
        seed_everything(self.seed)
        data = self._dataset(adata, labels=codes)
        train_pos, val_pos = self._split(keep.size, validation_fraction, stratify=codes[keep])
        for p in self.backbone.parameters():
            p.requires_grad_(not freeze_backbone)
        task = ClassifierTask(self.backbone, self.cls_head, pooling)
        weight = None
        if class_weight == "balanced":
            weight = torch.as_tensor(balanced_class_weights(codes[keep[train_pos]], len(classes)),
                                     dtype=torch.float32, device=self.device)
        loss_fn, score_fn = classifier_objective(weight, label_smoothing, codes[keep[val_pos]], len(classes),
                                                 self.device)
        plan = TrainingPlan(epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                            grad_clip=grad_clip, patience=early_stopping_patience, schedule=lr_schedule,
                            warmup_fraction=warmup_fraction, monitor=early_stopping_metric, desc="fit",
                            num_workers=num_workers)
        try:
            history = self._trainer().train(task, loss_fn, Subset(data, keep[train_pos]),
                                            Subset(data, keep[val_pos]) if len(val_pos) else None, plan, score_fn)
        finally:
            for p in self.backbone.parameters():
                p.requires_grad_(True)
        self.history["fit"] = history
        return history

    # ---------------------------------------------------------------------------------------------- inference
    def predict(self, adata, *, batch_size: int = 64, key_added: str | None = None,
                return_probabilities: bool = False):
        """Predicted labels (a categorical of the training classes), or ``(n_cells, n_classes)`` probabilities.

        With ``key_added``, also writes the labels to ``adata.obs[key_added]``.
        """
        if self.cls_head is None or self.labels is None:
            raise CapeInputError("the model has no annotation head: call train(adata, label_key) first")
        parts = forward_all(self, adata, batch_size, lambda h, b: torch.softmax(
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

        ``pooling`` (:func:`~cape.models.heads.pool_cells`) defaults to the pooling the annotation head was
        trained with, and the ``<cls>`` state before any :meth:`train`. :meth:`embed` writes the same numbers.
        """
        return embeddings(self, adata, batch_size, pooling, genes=False)[0]

    def embed(self, adata, *, key_added: str = "X_cape", gene_key: str | None = "cape_gene_embedding",
              batch_size: int = 64, copy: bool = False, pooling: str | None = None):
        """Cell embeddings (:meth:`get_latent_representation`) → ``obsm[key_added]``; gene embeddings →
        ``varm[gene_key]``.

        A gene's embedding is the mean of its contextual hidden states over the cells where it was tokenised
        (zeros for genes never tokenised); ``var[f"{gene_key}_n_cells"]`` counts those cells.
        Returns the AnnData when ``copy``, else None.
        """
        adata = adata.copy() if copy else adata
        cells, gene_sum, gene_n = embeddings(self, adata, batch_size, pooling, genes=True)
        adata.obsm[key_added] = cells
        if gene_key is not None:
            write_gene_embedding(self, adata, gene_key, gene_sum, gene_n)
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
        return persistence.model_config(self)

    def _record(self) -> dict[str, Any]:
        return persistence.model_record(self)

    def save(self, directory: str | Path, *, overwrite: bool = False) -> Path:
        """Write ``config.json``, ``vocab.json``, ``model.pt`` (state dict) and ``positions.pt`` to ``directory``.

        An existing non-empty ``directory`` is refused unless ``overwrite`` (and even then when it is not a cape
        model directory). Written to a temporary folder first and renamed, so a failure leaves no partial model
        behind. Only the main process writes under DDP.
        """
        return persistence.save_model(self, directory, overwrite=overwrite)

    @classmethod
    def load(cls, directory: str | Path, adata=None, *, device: str = "auto") -> CellTransformer:
        """Load a model written by :meth:`save`; with ``adata``, check that its genes match the vocabulary."""
        return persistence.load_model(cls, directory, adata, device=device)

    @classmethod
    def from_scgpt(cls, directory: str | Path, adata, *, encoding: str = "none",
                   encoding_options: dict[str, Any] | None = None, positions: GenePositions | None = None,
                   layer: str | None = None, use_raw: bool = False, max_len: int = 1200,
                   include_zero_genes: bool = False, dropout: float | None = None, device: str = "auto",
                   amp: bool | str = "auto", seed: int | None = None) -> CellTransformer:
        """A CellTransformer around a published scGPT checkpoint (:func:`load_scgpt_checkpoint`).

        The gene vocabulary is the checkpoint's; genes of ``adata`` outside it are left out (as scGPT does), and
        positions for ``encoding`` are read from ``adata`` for the genes it shares with the vocabulary. Continue
        with :meth:`pretrain` / :meth:`train` / :meth:`embed`.
        """
        return scgpt_checkpoint.cell_transformer_from_scgpt(
            cls, directory, adata, encoding=encoding, encoding_options=encoding_options, positions=positions,
            layer=layer, use_raw=use_raw, max_len=max_len, include_zero_genes=include_zero_genes, dropout=dropout,
            device=device, amp=amp, seed=seed)

    def __repr__(self) -> str:
        n = sum(p.numel() for p in self.module.parameters())
        return (f"CellTransformer({self.architecture}, encoding={self.backbone.encoding_name!r}, "
                f"integration={self.backbone.integration!r}, {self.backbone.attention_kind} attention, "
                f"{len(self.vocab.genes)} genes, d_model={self.backbone.d_model}, {n:,} parameters, "
                f"device={self.device})")
