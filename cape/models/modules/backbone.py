"""Shared skeleton of the transformer backbones: token embedding, positional encoding hooks, encoder layers.

A backbone maps a padded batch of cells (``gene_ids``, ``values``, ``padding_mask``; see
:func:`cape.models.tokenize.collate_cells`) to hidden states ``(B, L, d_model)``; position 0 is ``<cls>``, whose
hidden state is the cell embedding. The positional encoding is one of :func:`cape.encodings.available`, built
with the backbone's shape and used at the four hooks of :class:`cape.encodings.PositionalEncoding`.

**Integration** (``integration=``): how the encoding meets the backbone's own gene-identity embedding.

* ``"complement"``: the backbone keeps it — scGPT's learnt gene table, scBERT's static gene2vec-role embedding
  (co-expression vectors or a gene2vec file, :mod:`cape.encodings.static_absolute`) — and the encoding rotates q/k
  or adds on top. Two cells expressing different genes at equal values then always differ, whatever the encoding.
* ``"replace"``: CAPE Supp. F.2 — "CAPE-generated positional encodings are used in place of the original
  positional encodings": no gene table (scGPT) or static embedding (scBERT); the encoding is the only source of
  gene identity. CAPE then also rotates the token embedding (F.108, ``replace_options`` of the encoding), and
  "no encoding" has no gene identity at all (the paper's CAPE-null, Table 3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ... import encodings
from ..._errors import CapeInputError
from ...encodings import EncodingContext, GenePositions, PositionalEncoding
from .dropout import Dropout

#: ``integration=`` values (module docstring).
INTEGRATIONS = ("complement", "replace")


@dataclass(frozen=True)
class NetworkConfig:
    """Shape of the encoder and its annotation head.

    Attributes
    ----------
    d_model, n_heads, n_layers, d_ff, dropout
        Encoder shape (``d_ff`` None: ``4 · d_model``). Defaults are CPU-sized; the paper uses 512/8/4 (scGPT) and
        200 (scBERT). ``dropout`` acts on the residual and feed-forward paths; its default 0.2 is scGPT's
        fine-tuning dropout and :attr:`cape.models.TrainingRecipe.dropout`.
    gene_embedding
        Learnt per-gene embedding (None: the architecture's rule — scGPT's gene table in ``"complement"`` mode only;
        scBERT never).
    n_cls_layers
        Layers of the annotation head (scGPT: 3); the backbones do not read it.
    integration
        ``"complement"`` (keep the backbone's gene-identity embedding beside the encoding) or ``"replace"`` (the
        encoding takes its place, CAPE Supp. F.2); None: the architecture's default
        (:data:`cape.models.hyperparameters.DEFAULT_INTEGRATION`; ``"complement"`` for a backbone built directly).
    """

    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int | None = None
    dropout: float = 0.2
    gene_embedding: bool | None = None
    n_cls_layers: int = 3
    integration: str | None = None


#: The network of a backbone built without one: NetworkConfig's, with the backbones' own dropout of 0.1 (a
#: CellTransformer's default is NetworkConfig's 0.2, the training recipe's).
BACKBONE_NETWORK = NetworkConfig(dropout=0.1)


class Backbone(nn.Module):
    """Base class of :class:`~cape.models.ScGPTBackbone` and :class:`~cape.models.ScBERTBackbone`.

    Parameters
    ----------
    vocab_size
        Number of gene-vocabulary entries (special tokens included).
    pad_id
        Vocabulary index of ``<pad>``.
    network
        Shape of the encoder (:class:`NetworkConfig`: ``d_model``, ``n_heads``, ``n_layers``, ``d_ff``, ``dropout``),
        whether it keeps a learnt gene embedding (``gene_embedding``, None: the backbone's own rule) and
        ``integration`` (module docstring; None: ``"complement"``).
    encoding
        Registry name of the positional encoding (:func:`cape.encodings.available`).
    encoding_options
        Extra keyword arguments for the encoding.
    positions
        Per-gene positions for encodings that need them (:func:`cape.models.positions.gene_positions`).
    identity
        Vectors of a static gene-identity embedding (backbones whose identity is static, scBERT, in
        ``"complement"`` mode).
    """

    architecture: ClassVar[str] = "base"
    #: Whether this backbone's attention is linear (no logits) for encodings that only transform q/k.
    linear_attention_possible: ClassVar[bool] = False
    #: How the backbone knows genes when nothing replaces it: a learnt table or a static (frozen) embedding.
    identity_kind: ClassVar[str] = "learnt"

    def __init__(self, *, vocab_size: int, pad_id: int, network: NetworkConfig, encoding: str,
                 encoding_options: dict[str, Any] | None, positions: GenePositions | None,
                 identity: GenePositions | None = None) -> None:
        super().__init__()
        integration = network.integration or "complement"
        d_model, n_heads, n_layers, dropout = network.d_model, network.n_heads, network.n_layers, network.dropout
        if integration not in INTEGRATIONS:
            raise CapeInputError(f"integration must be one of {', '.join(INTEGRATIONS)}, got {integration!r}")
        if d_model <= 0 or n_heads <= 0 or d_model % n_heads:
            raise CapeInputError(f"d_model={d_model} must be a positive multiple of n_heads={n_heads}")
        if n_layers < 1:
            raise CapeInputError(f"n_layers must be at least 1, got {n_layers}")
        if not 0.0 <= dropout < 1.0:
            raise CapeInputError(f"dropout must be in [0, 1), got {dropout}")
        self.vocab_size = int(vocab_size)
        self.pad_id = int(pad_id)
        self.d_model = int(d_model)
        self.n_heads = int(n_heads)
        self.n_layers = int(n_layers)
        self.d_ff = int(network.d_ff or 4 * d_model)
        self.dropout_p = float(dropout)
        self.encoding_name = encoding
        self.integration = integration
        encoding_class = encodings.get_class(encoding)
        options = dict(encoding_options or {})
        if integration == "replace":
            options = {**encoding_class.replace_options, **options}
        self.encoding_options = options
        # Linear (Performer) attention never forms logits: encodings that add to them get exact softmax.
        self.linear_attention = self.linear_attention_possible and not encoding_class.provides & {"bias",
                                                                                                  "attention"}
        self.encoding = encodings.get(encoding, d_model=self.d_model, n_heads=self.n_heads,
                                      n_layers=self.n_layers, vocab_size=self.vocab_size, positions=positions,
                                      **options)
        self.encoding.check_backbone(self.architecture, linear_attention=self.linear_attention)
        gene_embedding = network.gene_embedding
        if gene_embedding is None:
            gene_embedding = integration == "complement" and self.identity_kind == "learnt"
        self.use_gene_embedding = bool(gene_embedding)
        self.identity: PositionalEncoding | None = None
        if self.identity_kind == "static" and integration == "complement" and encoding != "static_absolute":
            if identity is None:
                raise CapeInputError(f"{self.architecture} with integration='complement' keeps its static gene "
                                     "embedding: pass its vectors (identity=, e.g. co-expression or gene2vec "
                                     "positions) or use integration='replace'")
            self.identity = encodings.get("static_absolute", d_model=self.d_model, n_heads=self.n_heads,
                                          n_layers=self.n_layers, vocab_size=self.vocab_size, positions=identity)

    @property
    def attention_kind(self) -> str:
        """``"performer"`` (linear FAVOR+) or ``"softmax"`` (exact, through SDPA)."""
        return "performer" if self.linear_attention else "softmax"

    # Subclasses build: self.layers (ModuleList of blocks taking (x, encoding, ctx, layer)) and self.final_norm.
    def embed_tokens(self, gene_ids: Tensor, values: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, gene_ids: Tensor, values: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Hidden states ``(B, L, d_model)`` of a padded batch.

        Parameters
        ----------
        gene_ids
            ``(B, L)`` long vocabulary indices, ``<cls>`` first.
        values
            ``(B, L)`` float binned values (masked positions ``MASK_VALUE``, padding ``PAD_VALUE``).
        padding_mask
            ``(B, L)`` bool, True = padding.
        """
        x, ctx = self.encoder_input(gene_ids, values, padding_mask)
        for i, layer in enumerate(self.layers):
            x = layer(x, self.encoding, ctx, i)
            self.encoding.after_layer(ctx, x, i)
        return self.final_norm(x)

    def encoder_input(self, gene_ids: Tensor, values: Tensor, padding_mask: Tensor | None = None
                      ) -> tuple[Tensor, EncodingContext]:
        """The first layer's input ``(B, L, d_model)`` and the encoding's context for this batch: token embedding,
        the static gene embedding kept in ``"complement"`` mode, then the encoding's input term (absolute
        encodings add, CAPE's F.108 rotates)."""
        x = self.embed_tokens(gene_ids, values)
        if self.identity is not None:
            x = self.identity.apply_input(x, self.identity.begin(gene_ids, padding_mask))
        ctx = self.encoding.begin(gene_ids, padding_mask, values=values)
        return self.encoding.apply_input(x, ctx), ctx

    @staticmethod
    def cell_embedding(hidden: Tensor) -> Tensor:
        """The ``<cls>`` token's hidden state, ``(B, d_model)``."""
        return hidden[:, 0]

    def config(self) -> dict[str, Any]:
        """The backbone's settings as plain values (shape, encoding, integration, architecture options)."""
        raise NotImplementedError


def feed_forward(d_model: int, d_ff: int, dropout: float, activation: type[nn.Module]) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_model, d_ff), activation(), Dropout(dropout), nn.Linear(d_ff, d_model))


def init_uniform_(embedding: nn.Embedding, bound: float = 0.1) -> None:
    with torch.no_grad():
        embedding.weight.uniform_(-bound, bound)
        if embedding.padding_idx is not None:
            embedding.weight[embedding.padding_idx].zero_()
