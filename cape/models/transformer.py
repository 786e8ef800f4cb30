"""``CellTransformer``: a single-cell transformer with a chosen positional encoding, used like an scvi-tools model.

>>> model = cape.models.CellTransformer(adata, architecture="scgpt", encoding="cape")
>>> model.pretrain(adata, epochs=5)                  # masked value prediction on unlabelled cells
>>> model.train(adata, label_key="cell_type")        # annotation head
>>> adata.obs["pred"] = model.predict(adata)
>>> model.embed(adata)                               # obsm["X_cape"], varm["cape_gene_embedding"]
>>> cells = model.get_latent_representation(adata)  # the same cell embedding as an array
>>> model.save("model_dir"); model = cape.models.CellTransformer.load("model_dir", adata)

Training runs on ``device="auto"`` (CUDA when present, with mixed precision), clips gradients, keeps the best
epoch on a validation split (early stopping), shows progress bars and is seeded. Under ``torchrun`` it trains
with DDP (:mod:`cape.models.distributed`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset

from .._errors import CapeInputError
from .._progress import progress
from .._settings import resolve_device, resolve_seed, seed_everything
from ..encodings import GenePositions
from ..encodings.static_absolute import read_gene2vec
from . import distributed
from .heads import ClsDecoder, ExprDecoder, check_pooling, pool_cells, pooled_width
from .objectives import ClassifierTask, MaskedValueTask
from .persistence import load_model, model_record, save_model
from .positions import gene_positions
from .scbert import ScBERTBackbone
from .scgpt import ScGPTBackbone
from .scgpt_checkpoint import transformer_from_scgpt
from .tokenize import CellCollator, CellDataset, GeneVocab, TokenizerConfig, gene_ids, n_value_levels, vocabulary_genes
from .training import CLASS_WEIGHTS, Runtime, balanced_class_weights, split_cells, train_objective

logger = logging.getLogger("cape")

ARCHITECTURES = {"scgpt": ScGPTBackbone, "scbert": ScBERTBackbone}
#: scGPT: 51 quantile bins; scBERT: log2 bins 0..5.
DEFAULT_BINNING = {"scgpt": ("quantile", 51), "scbert": ("log2", 5)}
_CONFIG_FILE, _WEIGHTS_FILE, _VOCAB_FILE, _POSITIONS_FILE = "config.json", "model.pt", "vocab.json", "positions.pt"
#: ``vocabulary=`` choices: the genes of Steps I–III (``var["cape_used"]``) or every gene of the AnnData.
VOCABULARIES = ("used", "all")


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
        return vocabulary_genes(adata, var_names, self.vocabulary)

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
        return gene_ids(self.vocab, var_names, strict=getattr(self, "strict_genes", True),
                        vocabulary=getattr(self, "vocabulary", "all"))

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
        return split_cells(n, validation_fraction, self.seed, stratify)

    @property
    def runtime(self) -> Runtime:
        """Device, mixed precision, seed and padding id, as the training engine takes them."""
        return Runtime(self.device, self.amp, self.seed, self.vocab.pad_id)

    def _autocast(self):
        return self.runtime.autocast()

    def _to_device(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return self.runtime.to_device(batch)

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
        task = MaskedValueTask(self.backbone, self.expr_head, value_scale=self._value_scale())
        history = train_objective(task, lambda m, b: m(b), Subset(data, train_idx),
                                  Subset(data, val_idx) if len(val_idx) else None, self.runtime, epochs=epochs,
                                  batch_size=batch_size, lr=lr, weight_decay=weight_decay, grad_clip=grad_clip,
                                  patience=early_stopping_patience, desc="pretrain", num_workers=num_workers)
        self.history["pretrain"] = history
        return history

    def train(self, adata, label_key: str, epochs: int = 100, *, batch_size: int = 32, lr: float = 1e-3,
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
        task = ClassifierTask(self.backbone, self.cls_head, pooling)
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
            history = train_objective(task, loss_fn, Subset(data, keep[train_pos]),
                                      Subset(data, keep[val_pos]) if len(val_pos) else None, self.runtime,
                                      epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                                      grad_clip=grad_clip, patience=early_stopping_patience, desc="fit",
                                      num_workers=num_workers, schedule=lr_schedule, warmup_fraction=warmup_fraction,
                                      score_fn=score_fn, monitor=early_stopping_metric)
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

    def get_latent_representation(self, adata, *, batch_size: int = 64, pooling: str | None = None) -> np.ndarray:
        """Cell embeddings, cells × d (float32): the pooled hidden states that :meth:`embed` writes to
        ``obsm["X_cape"]`` (``pooling`` as there)."""
        pooling = check_pooling(pooling or self.pooling)
        parts = self._forward_all(adata, batch_size, lambda h, b: pool_cells(h, b["padding_mask"], pooling).cpu())
        return torch.cat(parts).numpy().astype(np.float32)

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
        adata.uns.setdefault("cape", {})["model"] = model_record(self)
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

    def save(self, directory: str | Path, *, overwrite: bool = False) -> Path:
        """Write the model to ``directory`` (:func:`~cape.models.persistence.save_model`): ``config.json``,
        ``vocab.json``, ``model.pt`` and ``positions.pt``, atomically; an existing model directory is replaced only
        with ``overwrite=True``. Only the main process writes under DDP."""
        return save_model(self, directory, overwrite=overwrite)

    @classmethod
    def load(cls, directory: str | Path, adata=None, *, device: str = "auto") -> CellTransformer:
        """Load a model written by :meth:`save`; with ``adata``, check that its genes match the vocabulary."""
        return load_model(cls, directory, adata, device=device)

    @classmethod
    def from_scgpt(cls, directory: str | Path, adata, **kwargs: Any) -> CellTransformer:
        """A model around a published scGPT checkpoint folder (args.json, vocab.json, best_model.pt); keywords as
        :func:`~cape.models.scgpt_checkpoint.transformer_from_scgpt`. Continue with :meth:`pretrain` /
        :meth:`train` / :meth:`embed`."""
        return transformer_from_scgpt(cls, directory, adata, **kwargs)

    def __repr__(self) -> str:
        n = sum(p.numel() for p in self.module.parameters())
        return (f"CellTransformer({self.architecture}, encoding={self.backbone.encoding_name!r}, "
                f"{len(self.vocab.genes)} genes, d_model={self.backbone.d_model}, {n:,} parameters, "
                f"device={self.device})")


