"""scBERT-style backbone (Yang et al. 2022): binned expression tokens, Performer (FAVOR+) attention.

Tokens are scBERT's log2 bins ``0..n_bins`` plus a mask and a pad token; the gene's identity enters through a
frozen gene2vec-role embedding (``encoding="static_absolute"``, or kept beside any other encoding with
``integration="complement"``) or, with ``integration="replace"``, through the positional encoding alone (CAPE
rotates the token embedding and q/k, Supp. F.2). Attention is our own FAVOR+ implementation
(:class:`PerformerSelfAttention`) with the encoding's q/k transform before the random feature map. Encodings that
need an explicit genes×genes logit term (additive biases, HoPE's logits) get exact softmax attention
(:class:`~cape.models.modules.self_attention.SelfAttention`, SDPA) instead, since linear attention never forms the
logits; :attr:`~cape.models.modules.backbone.Backbone.attention_kind` says which one a model uses.

The paper's scBERT uses ``d_model = 200`` (10 heads, 6 layers); defaults here are CPU-sized.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ...encodings import EncodingContext, GenePositions, PositionalEncoding
from .backbone import BACKBONE_NETWORK, Backbone, NetworkConfig, feed_forward, init_uniform_
from .dropout import Dropout
from .self_attention import PerformerSelfAttention, SelfAttention


class PerformerLayer(nn.Module):
    """Pre-norm Performer block: ``x + attn(LN(x))`` then ``x + FF(LN(x))`` with GELU (``exact``: softmax
    attention in place of FAVOR+, for encodings that add to the logits)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, *, n_features: int | None,
                 feature_redraw_interval: int | None, seed: int, exact: bool = False) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.self_attn = SelfAttention(d_model, n_heads, 0.0) if exact else PerformerSelfAttention(
            d_model, n_heads, dropout, n_features=n_features, feature_redraw_interval=feature_redraw_interval,
            seed=seed)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = feed_forward(d_model, d_ff, dropout, nn.GELU)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, encoding: PositionalEncoding, ctx: EncodingContext, layer: int) -> Tensor:
        x = x + self.dropout(self.self_attn(self.norm1(x), encoding, ctx, layer))
        return x + self.dropout(self.ff(self.norm2(x)))


class ScBERTBackbone(Backbone):
    """scBERT-style Performer encoder over binned expression tokens.

    Parameters
    ----------
    vocab_size, pad_id, cls_id
        Gene vocabulary size, ``<pad>`` and ``<cls>`` indices (genes are positions, not tokens, in scBERT;
        ``<cls>`` gets its own token embedding).
    n_levels
        Number of expression levels (log2 bins ``0..n_bins``: ``n_bins + 1``; scBERT: 6).
    network
        Encoder shape (paper: 200, 10, 6), a learnt gene embedding as well (``gene_embedding``; off in scBERT) and
        ``integration``: ``"complement"`` keeps the static gene embedding with vectors ``identity``, ``"replace"``
        drops it (:class:`~cape.models.modules.backbone.NetworkConfig`; default
        :data:`~cape.models.modules.backbone.BACKBONE_NETWORK`, 64/4/2 with dropout 0.1).
    encoding, encoding_options, positions
        Positional encoding; encodings that add to the logits run with exact softmax attention.
    identity
        Vectors of the static gene embedding (``"complement"`` mode).
    n_features, feature_redraw_interval, seed
        FAVOR+ settings (see :class:`PerformerSelfAttention`).
    """

    architecture = "scbert"
    linear_attention_possible = True
    identity_kind = "static"

    def __init__(self, vocab_size: int, pad_id: int = 0, *, cls_id: int = 1, n_levels: int = 6,
                 network: NetworkConfig = BACKBONE_NETWORK, encoding: str = "none",
                 encoding_options: dict[str, Any] | None = None, positions: GenePositions | None = None,
                 identity: GenePositions | None = None, n_features: int | None = None,
                 feature_redraw_interval: int | None = None, seed: int = 0) -> None:
        super().__init__(vocab_size=vocab_size, pad_id=pad_id, network=network, encoding=encoding,
                         encoding_options=encoding_options, positions=positions, identity=identity)
        d_model, dropout = self.d_model, self.dropout_p
        self.n_levels = int(n_levels)
        self.cls_id = int(cls_id)
        self.mask_token = self.n_levels
        self.pad_token = self.n_levels + 1
        self.cls_token = self.n_levels + 2  # <cls> needs its own embedding: scBERT genes have no token identity
        self.n_features = n_features
        self.feature_redraw_interval = feature_redraw_interval
        self.seed = int(seed)
        self.token_emb = nn.Embedding(self.n_levels + 3, d_model, padding_idx=self.pad_token)
        init_uniform_(self.token_emb)
        self.gene_emb = nn.Embedding(vocab_size, d_model, padding_idx=pad_id) if self.use_gene_embedding else None
        if self.gene_emb is not None:
            init_uniform_(self.gene_emb)
        self.emb_dropout = Dropout(dropout)
        self.layers = nn.ModuleList(
            PerformerLayer(d_model, self.n_heads, self.d_ff, dropout, n_features=n_features,
                           feature_redraw_interval=feature_redraw_interval, seed=self.seed + i,
                           exact=not self.linear_attention)
            for i in range(self.n_layers)
        )
        self.final_norm = nn.LayerNorm(d_model)

    def tokens(self, values: Tensor) -> Tensor:
        """Binned values → token ids: levels as is, masked (negative −1) → mask token, padding (−2) → pad token."""
        tok = values.round().long().clamp(0, self.n_levels - 1)
        tok = tok.masked_fill(values == -1, self.mask_token)
        return tok.masked_fill(values <= -2, self.pad_token)

    def embed_tokens(self, gene_ids: Tensor, values: Tensor) -> Tensor:
        x = self.token_emb(self.tokens(values).masked_fill(gene_ids == self.cls_id, self.cls_token))
        if self.gene_emb is not None:
            x = x + self.gene_emb(gene_ids)
        return self.emb_dropout(x)

    def config(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "pad_id": self.pad_id, "cls_id": self.cls_id, "n_levels": self.n_levels,
                "d_model": self.d_model, "n_heads": self.n_heads, "n_layers": self.n_layers, "d_ff": self.d_ff,
                "dropout": self.dropout_p, "encoding": self.encoding_name,
                "encoding_options": self.encoding_options, "gene_embedding": self.use_gene_embedding,
                "n_features": self.n_features, "feature_redraw_interval": self.feature_redraw_interval,
                "seed": self.seed, "integration": self.integration}
