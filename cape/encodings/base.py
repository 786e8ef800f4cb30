"""The one interface every positional encoding implements, and the per-gene positions it reads.

A backbone uses an encoding in four places of its forward pass::

    ctx = enc.begin(gene_ids, key_padding_mask, values=values)   # once per forward pass
    x = enc.apply_input(token_embedding, ctx)                    # + input_embedding, or F.108 rotation
    for layer in range(n_layers):
        q, k, v = ...                                            # (B, H, L, head_dim)
        out = enc.attention(q, k, v, ctx, layer)                 # = transform_qk + attn_bias + SDPA
        hidden = ...                                             # rest of the block (MLP, norms)
        enc.after_layer(ctx, hidden, layer)                      # TAPE updates its positional state

``attention`` is the reference path for SDPA backbones: it applies :meth:`transform_qk` to q and k (never v),
adds :meth:`attn_bias` and the key-padding mask as a float ``attn_mask``, and calls
``torch.nn.functional.scaled_dot_product_attention``. Encodings whose logits are not a q/k transform plus a
bias (``"attention"`` in :attr:`PositionalEncoding.provides`, e.g. symmetric HoPE) override it; TAPE overrides
it to fuse its position update into the same SDPA call. A backbone that calls SDPA itself must call
:meth:`transform_qk` (and :meth:`attn_bias`) every layer and still call :meth:`after_layer`. Linear-attention
backbones (Performer) call :meth:`transform_qk` before their feature map and must refuse encodings that
provide ``"bias"`` or ``"attention"`` (:meth:`PositionalEncoding.check_backbone` raises the one-line error).

Conventions
-----------
* ``key_padding_mask``: (B, L) bool, **True marks padding** (keys to ignore), as in
  ``torch.nn.MultiheadAttention``.
* Tokens without a position (``<cls>``, ``<pad>``, genes outside the causal graph) get the identity
  transform, a zero bias and a zero input embedding; :attr:`GenePositions.has_position` says which
  vocabulary entries have one.
* Rotation planes are adjacent pairs ``(x[..., 2i], x[..., 2i+1])`` (see :mod:`cape.encodings.rotary`).
* Per-cell orders (``rope(order="expression")``) read ``values=`` given to :meth:`PositionalEncoding.begin`.
* Modules hold their position tables as (persistent) buffers: ``state_dict`` round trips restore them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from .._errors import CapeInputError

# What each position field is read from and which step writes it; used in error messages.
POSITION_SOURCES: dict[str, str] = {
    "cape_angles": "varm['cape_angles'] missing: run `cape encode` / cape.tl.rotary_encoding",
    "cape_poincare": "varm['cape_poincare'] missing: run `cape embed` / cape.tl.hyperbolic_embedding",
    "cape_dag": "varp['cape_dag'] missing: run `cape causal` / cape.tl.causal_graph",
    "co_expression": "no gene vectors and no expression matrix given: pass a gene2vec file (gene2vec_path=) "
    "or build positions with cape.encodings.static_absolute.co_expression_vectors(X)",
    "values": "this encoding ranks genes by expression per cell: pass values= (B, L) to begin()",
}


@dataclass
class GenePositions:
    """Per-vocabulary-index positions, built from AnnData by the models layer (index = gene token id).

    Attributes
    ----------
    vectors
        (V, d) float: a position vector per vocabulary entry, e.g. ``varm["cape_poincare"]`` (Poincaré
        coordinates e) or ``varm["cape_angles"]`` (already φ = c·e; then set ``vectors_are_angles=True``).
        Rows of entries without a position are ignored (treated as zero / identity).
    order
        (V,) float: a scalar position per entry, e.g. the normalised topological rank of the DAG
        (:func:`cape.encodings.ordering.topological_positions`).
    has_position
        (V,) bool: which entries have a position. Defaults to "every entry whose vector/order is finite".
    graph_distance
        (V, V) float, optional: pairwise distance (e.g. shortest-path length on the undirected DAG skeleton,
        or Poincaré distance), used by ``grape_a(distance="graph")``.
    vectors_are_angles
        True when ``vectors`` already holds rotary angles (``varm["cape_angles"]``).
    angle_params
        With angles: the Step III map that made them, ``{"scale": c, "bands": B, "band_top": ω_max}``
        (``uns["cape"]["rotary_encoding"]["params"]``), so that an encoding asked for another scale or number of
        bands can recover e and re-map; None when unknown (then such a request is refused).
    source
        Free text naming where the positions came from (for logs and error messages).
    """

    vectors: Tensor | None = None
    order: Tensor | None = None
    has_position: Tensor | None = None
    graph_distance: Tensor | None = None
    vectors_are_angles: bool = False
    angle_params: dict | None = None
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("vectors", "order", "has_position", "graph_distance"):  # accept NumPy arrays too
            value = getattr(self, name)
            if value is not None and not isinstance(value, torch.Tensor):
                setattr(self, name, torch.as_tensor(np.asarray(value)))
        sizes = {t.shape[0] for t in (self.vectors, self.order, self.graph_distance) if t is not None}
        if len(sizes) > 1:
            raise CapeInputError(f"GenePositions fields disagree on the vocabulary size: {sorted(sizes)}")
        if self.vectors is not None and self.vectors.ndim != 2:
            shape = tuple(self.vectors.shape)
            raise CapeInputError(f"GenePositions.vectors must be (V, d), got shape {shape}")
        if self.order is not None and self.order.ndim != 1:
            raise CapeInputError(f"GenePositions.order must be (V,), got shape {tuple(self.order.shape)}")
        if self.graph_distance is not None and (
            self.graph_distance.ndim != 2 or self.graph_distance.shape[0] != self.graph_distance.shape[1]
        ):
            raise CapeInputError("GenePositions.graph_distance must be a square (V, V) matrix")
        if self.has_position is None:
            finite = None
            for t in (self.vectors, self.order):
                if t is None:
                    continue
                ok = torch.isfinite(t) if t.ndim == 1 else torch.isfinite(t).all(dim=1)
                finite = ok if finite is None else finite & ok
            if finite is not None:
                self.has_position = finite
        elif self.has_position.dtype != torch.bool:
            self.has_position = self.has_position.bool()

    @property
    def vocab_size(self) -> int | None:
        for t in (self.vectors, self.order, self.has_position, self.graph_distance):
            if t is not None:
                return int(t.shape[0])
        return None

    @property
    def dim(self) -> int | None:
        """Width d of :attr:`vectors` (None without vectors)."""
        return None if self.vectors is None else int(self.vectors.shape[1])


@dataclass
class EncodingContext:
    """Per-forward-pass state: the batch's gene ids, masks and whatever an encoding caches between layers.

    Attributes
    ----------
    gene_ids
        (B, L) long vocabulary indices.
    key_padding_mask
        (B, L) bool, True = padding, or None.
    has_position
        (B, L) bool: token has a position (False for special tokens, padding, genes outside the graph).
    values
        (B, L) float expression values of the tokens, or None (used by per-cell orderings).
    state
        Encoding-specific cache (cos/sin tables, TAPE's phases); keys are private to the encoding.
    """

    gene_ids: Tensor
    key_padding_mask: Tensor | None
    has_position: Tensor
    values: Tensor | None = None
    state: dict[str, Any] = field(default_factory=dict)


def attention_mask(key_padding_mask: Tensor | None, bias: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """Float ``attn_mask`` for SDPA: the positional ``bias`` plus −inf on padded keys (None when neither).

    ``bias`` is broadcastable to (B, H, L, L); the result broadcasts to the same shape.
    """
    mask = None if bias is None else bias.to(dtype)
    if key_padding_mask is not None:
        pad = torch.zeros(key_padding_mask.shape, dtype=dtype, device=key_padding_mask.device)
        pad = pad.masked_fill(key_padding_mask, float("-inf"))[:, None, None, :]
        mask = pad if mask is None else mask + pad
    return mask


class PositionalEncoding(torch.nn.Module):
    """Base class: no position at all. Subclasses override the hooks they provide.

    Parameters
    ----------
    d_model, n_heads, n_layers, vocab_size
        Shape of the backbone (head_dim = d_model // n_heads).
    positions
        Per-gene positions (see :class:`GenePositions`); required by encodings whose :attr:`requires` is set.
    """

    name: ClassVar[str] = "base"
    #: subset of {"qk", "bias", "input", "attention"}: which hooks do something.
    provides: ClassVar[frozenset[str]] = frozenset()
    #: AnnData key the positions come from, with the step that makes it (a key of POSITION_SOURCES), or None.
    requires: ClassVar[str | None] = None
    #: True when the q/k transform rotates adjacent planes (head_dim must be even).
    rotary: ClassVar[bool] = False
    #: Options a backbone adds (under the user's own) when this encoding *replaces* its gene-identity embedding
    #: (``integration="replace"``, CAPE Supp. F.2), e.g. CAPE also rotates the token embedding (F.108).
    replace_options: ClassVar[dict[str, Any]] = {}

    def __init__(self, *, d_model: int, n_heads: int, n_layers: int, vocab_size: int,
                 positions: GenePositions | None = None, **options: Any) -> None:
        super().__init__()
        if options:
            raise CapeInputError(
                f"encoding '{self.name}' got unknown option(s): {', '.join(sorted(options))}"
            )
        if d_model <= 0 or n_heads <= 0 or d_model % n_heads:
            raise CapeInputError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model = int(d_model)
        self.n_heads = int(n_heads)
        self.n_layers = int(n_layers)
        self.vocab_size = int(vocab_size)
        self.head_dim = self.d_model // self.n_heads
        if self.rotary and self.head_dim % 2:
            raise CapeInputError(
                f"encoding '{self.name}' rotates pairs of q/k coordinates: head_dim = d_model / n_heads "
                f"= {self.head_dim} must be even"
            )
        if positions is not None and positions.vocab_size is not None and positions.vocab_size != vocab_size:
            raise CapeInputError(
                f"positions cover {positions.vocab_size} vocabulary entries but vocab_size is {vocab_size}"
            )
        self.positions = positions
        if positions is not None and positions.has_position is not None:
            self.register_buffer("has_position_table", positions.has_position.clone().bool())
        else:
            self.has_position_table = None

    # -- validation helpers ---------------------------------------------------------------------------------
    def _missing(self, key: str | None = None) -> CapeInputError:
        key = key or self.requires or ""
        why = POSITION_SOURCES.get(key, f"positions '{key}' missing")
        return CapeInputError(f"encoding '{self.name}' needs gene positions: {why}")

    def _need_vectors(self) -> Tensor:
        if self.positions is None or self.positions.vectors is None:
            raise self._missing()
        return self.positions.vectors

    def _need_order(self) -> Tensor:
        if self.positions is None or self.positions.order is None:
            raise self._missing()
        return self.positions.order

    def check_backbone(self, backbone: str, *, linear_attention: bool) -> None:
        """Raise CapeInputError when a backbone cannot use this encoding (bias/explicit logits need SDPA)."""
        if linear_attention and self.provides & {"bias", "attention"}:
            raise CapeInputError(
                f"encoding '{self.name}' needs an explicit genes×genes attention logit term, which backbone "
                f"'{backbone}' (linear/Performer attention) cannot apply; use a q/k encoding "
                "(rope, cape, grape_m, tape) or an SDPA backbone"
            )

    # -- hooks ----------------------------------------------------------------------------------------------
    def begin(self, gene_ids: Tensor, key_padding_mask: Tensor | None = None, *,
              values: Tensor | None = None) -> EncodingContext:
        """Start a forward pass: look up per-token positions once and cache what every layer reuses."""
        if gene_ids.ndim != 2:
            raise CapeInputError(f"gene_ids must be (batch, length), got shape {tuple(gene_ids.shape)}")
        if self.has_position_table is not None:
            has = self.has_position_table[gene_ids]
        else:
            has = torch.zeros(gene_ids.shape, dtype=torch.bool, device=gene_ids.device)
        if key_padding_mask is not None:
            has = has & ~key_padding_mask
        ctx = EncodingContext(gene_ids=gene_ids, key_padding_mask=key_padding_mask, has_position=has,
                              values=values)
        self._prepare(ctx)
        return ctx

    def _prepare(self, ctx: EncodingContext) -> None:
        """Subclass hook called by :meth:`begin` (fill ``ctx.state``)."""

    def input_embedding(self, gene_ids: Tensor, ctx: EncodingContext) -> Tensor | None:
        """(B, L, d_model) added to the token embeddings, or None."""
        return None

    def apply_input(self, x: Tensor, ctx: EncodingContext) -> Tensor:
        """Token embeddings (B, L, d_model) → encoder input: ``x + input_embedding`` by default; CAPE's input
        mode (F.108) rotates x instead. Backbones call this rather than :meth:`input_embedding` directly."""
        emb = self.input_embedding(ctx.gene_ids, ctx)
        return x if emb is None else x + emb.to(x.dtype)

    def transform_qk(self, q: Tensor, k: Tensor, ctx: EncodingContext, layer: int) -> tuple[Tensor, Tensor]:
        """q, k: (B, H, L, head_dim) → transformed q, k (same shapes). Never applied to v."""
        return q, k

    def attn_bias(self, ctx: EncodingContext, layer: int) -> Tensor | None:
        """Additive logits broadcastable to (B, H, L, L), or None."""
        return None

    def attention(self, q: Tensor, k: Tensor, v: Tensor, ctx: EncodingContext, layer: int, *,
                  dropout_p: float = 0.0) -> Tensor:
        """Softmax attention with this encoding: (B, H, L, head_dim) → (B, H, L, head_dim)."""
        q, k = self.transform_qk(q, k, ctx, layer)
        mask = attention_mask(ctx.key_padding_mask, self.attn_bias(ctx, layer), q.dtype)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)

    def logits(self, q: Tensor, k: Tensor, ctx: EncodingContext, layer: int = 0) -> Tensor:
        """Explicit attention logits (B, H, L, L) with this encoding, scaled like SDPA, padding not masked.

        For diagnostics (e.g. :func:`cape.encodings.non_relativity.non_relativity`) only: it materialises the
        genes×genes matrix.
        """
        q2, k2 = self.transform_qk(q, k, ctx, layer)
        out = q2 @ k2.transpose(-1, -2) / math.sqrt(q2.shape[-1])
        bias = self.attn_bias(ctx, layer)
        return out if bias is None else out + bias

    def after_layer(self, ctx: EncodingContext, hidden: Tensor, layer: int) -> None:
        """Called with the block's output hidden states (B, L, d_model); stateless encodings do nothing."""

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, head_dim={self.head_dim}"


