"""``none``: no positional information at all (NoPE). A bidirectional encoder with it is
permutation-equivariant over genes; gene identity still reaches the model through the token embedding."""

from __future__ import annotations

from typing import ClassVar

from .base import PositionalEncoding


class NoPositionalEncoding(PositionalEncoding):
    """Identity q/k, no bias, no input term."""

    name: ClassVar[str] = "none"
