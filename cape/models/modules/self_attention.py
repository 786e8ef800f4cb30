"""Self-attention modules of the backbones.

* :class:`SelfAttention`: softmax attention through ``torch.nn.functional.scaled_dot_product_attention``; the
  positional encoding transforms q and k (never v) and may add a logit bias (``PositionalEncoding.attention``),
  so flash/memory-efficient kernels stay usable for rotary encodings.
* :class:`PerformerSelfAttention`: FAVOR+ linear attention (Choromanski et al. 2021, as in scBERT's Performer),
  with the encoding's q/k transform applied *before* the positive random feature map. It never forms an L×L
  matrix, so it cannot apply an additive logit bias.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..._errors import CapeInputError
from ...encodings import EncodingContext, PositionalEncoding
from .dropout import Dropout


def _check_heads(d_model: int, n_heads: int) -> int:
    if n_heads <= 0 or d_model % n_heads:
        raise CapeInputError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
    return d_model // n_heads


def _split_heads(x: Tensor, n_heads: int) -> Tensor:
    b, length, d = x.shape
    return x.view(b, length, n_heads, d // n_heads).transpose(1, 2)


def _merge_heads(x: Tensor) -> Tensor:
    b, h, length, hd = x.shape
    return x.transpose(1, 2).reshape(b, length, h * hd)


class SelfAttention(nn.Module):
    """Multi-head self-attention with a packed input projection (scGPT's ``in_proj``/``Wqkv`` layout).

    Parameters
    ----------
    d_model, n_heads
        Width and number of heads.
    dropout
        Attention-probability dropout (training only).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.head_dim = _check_heads(d_model, n_heads)
        self.n_heads = n_heads
        self.dropout = float(dropout)
        # Rows [q; k; v], each (n_heads · head_dim): the layout of torch's in_proj_weight and flash-attn's Wqkv.
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.in_proj(x).chunk(3, dim=-1)
        return _split_heads(q, self.n_heads), _split_heads(k, self.n_heads), _split_heads(v, self.n_heads)

    def forward(self, x: Tensor, encoding: PositionalEncoding, ctx: EncodingContext, layer: int) -> Tensor:
        q, k, v = self.qkv(x)
        out = encoding.attention(q, k, v, ctx, layer, dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(_merge_heads(out))


def orthogonal_gaussian(n_features: int, dim: int, generator: torch.Generator) -> Tensor:
    """(n_features, dim) block-orthogonal Gaussian projection of FAVOR+ (rows scaled to chi-distributed norms)."""
    blocks = []
    for _ in range(math.ceil(n_features / dim)):
        g = torch.randn(dim, dim, generator=generator)
        q, _ = torch.linalg.qr(g)
        blocks.append(q.T)
    w = torch.cat(blocks, dim=0)[:n_features]
    norms = torch.randn(n_features, dim, generator=generator).norm(dim=1)
    return w * norms[:, None]


def softmax_features(x: Tensor, projection: Tensor, *, is_query: bool, eps: float = 1e-4,
                     key_padding_mask: Tensor | None = None) -> Tensor:
    """Positive random features φ(x) with E[φ(q)·φ(k)] = exp(q·k/√d) (FAVOR+).

    ``x``: (B, H, L, d); ``projection``: (m, d). A max is subtracted for stability (per row for queries, per head
    for keys, over the non-padded keys only so that padding cannot change the result); it cancels in the attention
    normalisation up to the ``eps`` floor.
    """
    d = x.shape[-1]
    x = x * d**-0.25
    proj = x @ projection.T.to(x.dtype)
    sq = 0.5 * (x * x).sum(dim=-1, keepdim=True)
    if is_query:
        stab = proj.amax(dim=-1, keepdim=True)
    else:
        if key_padding_mask is not None:
            proj_for_max = proj.masked_fill(key_padding_mask[:, None, :, None], float("-inf"))
        else:
            proj_for_max = proj
        stab = proj_for_max.amax(dim=(-1, -2), keepdim=True)
    return (torch.exp(proj - sq - stab.detach()) + eps) / math.sqrt(projection.shape[0])


class PerformerSelfAttention(nn.Module):
    """FAVOR+ self-attention (bidirectional), the q/k transform applied before the feature map.

    Parameters
    ----------
    d_model, n_heads
        Width and heads.
    n_features
        Random features per head; default ``int(head_dim · ln head_dim)`` as scBERT/performer-pytorch.
    feature_redraw_interval
        Redraw the projection every this many training forward passes (scBERT: 1000); ``None`` keeps it fixed.
        Redraws are seeded by ``(seed, redraw count)`` so every DDP process draws the same features.
    seed
        Seed of the random features.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, *, n_features: int | None = None,
                 feature_redraw_interval: int | None = None, seed: int = 0) -> None:
        super().__init__()
        self.head_dim = _check_heads(d_model, n_heads)
        self.n_heads = n_heads
        self.n_features = n_features or max(1, int(self.head_dim * math.log(max(self.head_dim, 2))))
        self.feature_redraw_interval = feature_redraw_interval
        self.seed = int(seed)
        self.dropout = Dropout(dropout)
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.register_buffer("projection", self._draw(0))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def _draw(self, count: int) -> Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + count)
        return orthogonal_gaussian(self.n_features, self.head_dim, g)

    def forward(self, x: Tensor, encoding: PositionalEncoding, ctx: EncodingContext, layer: int) -> Tensor:
        if self.training and self.feature_redraw_interval:
            self.calls += 1
            if int(self.calls) % self.feature_redraw_interval == 0:
                count = int(self.calls) // self.feature_redraw_interval
                self.projection.copy_(self._draw(count).to(self.projection.device))
        q, k, v = self.in_proj(x).chunk(3, dim=-1)
        q, k, v = (_split_heads(t, self.n_heads) for t in (q, k, v))
        q, k = encoding.transform_qk(q, k, ctx, layer)
        if encoding.attn_bias(ctx, layer) is not None:
            raise CapeInputError(f"encoding '{encoding.name}' returned a logit bias, which Performer cannot apply")
        # Features in float32: exp() of logits overflows in half precision.
        qf = softmax_features(q.float(), self.projection, is_query=True)
        kf = softmax_features(k.float(), self.projection, is_query=False, key_padding_mask=ctx.key_padding_mask)
        if ctx.key_padding_mask is not None:
            kf = kf.masked_fill(ctx.key_padding_mask[:, None, :, None], 0.0)
        kv = kf.transpose(-1, -2) @ v.float()                       # (B, H, m, hd): no L×L tensor
        norm = qf @ kf.sum(dim=-2).unsqueeze(-1)                    # (B, H, L, 1)
        out = (qf @ kv) / norm
        out = self.dropout(out.to(v.dtype))
        return self.out_proj(_merge_heads(out))
