"""Dropout whose CPU mask costs a quarter of the random draws of ``torch.nn.Dropout``'s.

On CPU, ``torch.nn.functional.dropout`` draws one Bernoulli variate per element from the single-threaded
Mersenne twister, which makes it the costliest operation of a small backbone's training step (more than the
linear layers). :class:`Dropout` draws one 64-bit integer per four elements instead and keeps an element when
its 16-bit share is at or above ``round(p · 2¹⁶)``; kept elements are scaled by ``2¹⁶ / (2¹⁶ − round(p · 2¹⁶))``,
so the expectation is preserved exactly and the drop rate is ``p`` to within 2⁻¹⁷. The draws come from torch's
default generator, so ``torch.manual_seed`` makes them repeatable. On other devices (CUDA's Philox is fast) it is
``torch.nn.functional.dropout``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

#: Resolution of the CPU mask: one 16-bit share of a 64-bit draw per element.
MASK_LEVELS = 1 << 16


def cpu_keep_mask(shape: torch.Size, p: float, dtype: torch.dtype) -> Tensor:
    """Mask (``dtype``) of 0 and ``1 / (1 − p̂)`` with ``p̂ = round(p · 2¹⁶) / 2¹⁶``, drawn on CPU."""
    n = math.prod(shape)
    # At least one level kept: p within 2⁻¹⁷ of 1 would otherwise drop everything and divide by zero.
    drop = min(round(p * MASK_LEVELS), MASK_LEVELS - 1)
    # The full 64-bit range: ``random_()`` alone leaves the sign bit, and so a quarter of the shares, non-negative.
    draws = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(1 << 63), None)
    # int16 shares are in [−2¹⁵, 2¹⁵): shifting the threshold by −2¹⁵ keeps the comparison in int16.
    shares = draws.view(torch.int16)[:n].view(shape)
    keep = shares >= drop - MASK_LEVELS // 2
    return keep.to(dtype).mul_(MASK_LEVELS / (MASK_LEVELS - drop))


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of ``x`` with rate ``p`` (identity when not training or ``p`` is 0)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return nn.functional.dropout(x, p, training=True)
    return x * cpu_keep_mask(x.shape, p, x.dtype)


class Dropout(nn.Module):
    """Drop-in for ``torch.nn.Dropout`` (same ``p``, no parameters or buffers) with :func:`dropout`'s CPU mask."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = float(p)

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
