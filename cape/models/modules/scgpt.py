"""scGPT-style backbone (Cui et al. 2024): gene token embedding + continuous value encoder, post-norm encoder.

Module and parameter names follow scGPT's ``TransformerModel`` (``encoder``, ``value_encoder``, per layer
``self_attn.in_proj``/``out_proj``, ``linear1``, ``linear2``, ``norm1``, ``norm2``) so that published checkpoints map
onto it one to one (:mod:`cape.models.scgpt_checkpoint`). Attention goes through
``scaled_dot_product_attention`` after the positional encoding's q/k transform; bias encodings pass ``attn_mask``.

The paper's CAPE runs use 4 layers, 8 heads, ``d_model = 512``; the defaults here are small for CPU.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..._errors import CapeInputError
from ...encodings import EncodingContext, GenePositions, PositionalEncoding
from .backbone import BACKBONE_NETWORK, Backbone, NetworkConfig, init_uniform_
from .dropout import Dropout
from .self_attention import SelfAttention


class GeneEncoder(nn.Module):
    """scGPT's gene token embedding: ``Embedding`` (``padding_idx = <pad>``) then ``LayerNorm``."""

    def __init__(self, vocab_size: int, d_model: int, pad_id: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.enc_norm = nn.LayerNorm(d_model)
        init_uniform_(self.embedding)

    def forward(self, gene_ids: Tensor) -> Tensor:
        return self.enc_norm(self.embedding(gene_ids))


class ContinuousValueEncoder(nn.Module):
    """scGPT's value encoder: clamp to ``max_value`` → Linear(1, d) → ReLU → Linear(d, d) → LayerNorm → Dropout."""

    def __init__(self, d_model: int, dropout: float = 0.0, max_value: float = 512.0) -> None:
        super().__init__()
        self.linear1 = nn.Linear(1, d_model)
        self.activation = nn.ReLU()
        self.linear2 = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.max_value = float(max_value)

    def forward(self, values: Tensor) -> Tensor:
        x = values.unsqueeze(-1).clamp(max=self.max_value)
        x = self.linear2(self.activation(self.linear1(x)))
        return self.dropout(self.norm(x))


class PostNormEncoderLayer(nn.Module):
    """``nn.TransformerEncoderLayer(norm_first=False, activation="relu")`` with encoding-aware attention."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attention_dropout: float = 0.0) -> None:
        super().__init__()
        self.self_attn = SelfAttention(d_model, n_heads, attention_dropout)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)

    def forward(self, x: Tensor, encoding: PositionalEncoding, ctx: EncodingContext, layer: int) -> Tensor:
        x = self.norm1(x + self.dropout1(self.self_attn(x, encoding, ctx, layer)))
        ff = self.linear2(self.dropout(torch.relu(self.linear1(x))))
        return self.norm2(x + self.dropout2(ff))


class ScGPTBackbone(Backbone):
    """scGPT-style encoder.

    Parameters
    ----------
    vocab_size, pad_id
        Gene vocabulary size and ``<pad>`` index.
    network
        Encoder shape, gene embedding and integration (:class:`~cape.models.modules.backbone.NetworkConfig`;
        default: :data:`~cape.models.modules.backbone.BACKBONE_NETWORK`, 64/4/2 with dropout 0.1). scGPT's learnt
        gene embedding is kept with ``integration="complement"`` and dropped with ``"replace"`` (the paper's
        replacement of scGPT's gene codebook by the positional encoding, Supp. F.2) unless ``gene_embedding`` says
        otherwise.
    encoding, encoding_options, positions, identity
        Positional encoding (see :class:`~cape.models.modules.backbone.Backbone`).
    max_value
        Clamp of the value encoder's input.
    attention_dropout
        Dropout on the attention probabilities (default 0; ``dropout`` still acts on the residual and
        feed-forward paths). Any value > 0 makes PyTorch's CPU ``scaled_dot_product_attention`` leave its fused
        kernel for the explicit one, measured ~5× slower at batch 32 × 256 genes.
    """

    architecture = "scgpt"

    def __init__(self, vocab_size: int, pad_id: int = 0, *, network: NetworkConfig = BACKBONE_NETWORK,
                 encoding: str = "none", encoding_options: dict[str, Any] | None = None,
                 positions: GenePositions | None = None, identity: GenePositions | None = None,
                 max_value: float = 512.0, attention_dropout: float = 0.0) -> None:
        super().__init__(vocab_size=vocab_size, pad_id=pad_id, network=network, encoding=encoding,
                         encoding_options=encoding_options, positions=positions, identity=identity)
        d_model, dropout = self.d_model, self.dropout_p
        if not 0.0 <= attention_dropout < 1.0:
            raise CapeInputError(f"attention_dropout must be in [0, 1), got {attention_dropout}")
        self.attention_dropout = float(attention_dropout)
        self.max_value = float(max_value)
        self.encoder = GeneEncoder(vocab_size, d_model, pad_id) if self.use_gene_embedding else None
        self.value_encoder = ContinuousValueEncoder(d_model, dropout, max_value)
        self.layers = nn.ModuleList(
            PostNormEncoderLayer(d_model, self.n_heads, self.d_ff, dropout, self.attention_dropout)
            for _ in range(self.n_layers)
        )
        # Post-norm layers end in a LayerNorm already (scGPT has no final norm).
        self.final_norm = nn.Identity()

    def embed_tokens(self, gene_ids: Tensor, values: Tensor) -> Tensor:
        x = self.value_encoder(values)
        if self.encoder is not None:
            x = x + self.encoder(gene_ids)
        return x

    def config(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "pad_id": self.pad_id, "d_model": self.d_model,
                "n_heads": self.n_heads, "n_layers": self.n_layers, "d_ff": self.d_ff, "dropout": self.dropout_p,
                "encoding": self.encoding_name, "encoding_options": self.encoding_options,
                "gene_embedding": self.use_gene_embedding, "max_value": self.max_value,
                "attention_dropout": self.attention_dropout, "integration": self.integration}
