"""Positional encodings for gene tokens: one interface (:mod:`cape.encodings.base`), one module per encoding.

``get(name, **kw)`` builds an encoding by registry name; ``available()`` lists the names. Each encoding turns
per-gene positions (:class:`GenePositions`) into a q/k transform, an additive logit bias and/or an input
embedding. Each encoding's module docstring gives its formula; ``tests/test_encodings_*.py`` check its properties.
"""

from __future__ import annotations

import importlib
from typing import Any

from .._errors import CapeInputError
from .base import EncodingContext, GenePositions, PositionalEncoding, attention_mask
from .rotary import apply_planes, apply_rotary

# name -> (module, class); modules import on first use so that `import cape.encodings` stays light.
_REGISTRY: dict[str, tuple[str, str]] = {
    "none": ("none", "NoPositionalEncoding"),
    "static_absolute": ("static_absolute", "StaticAbsoluteEncoding"),
    "trainable_absolute": ("trainable_absolute", "TrainableAbsoluteEncoding"),
    "trainable_relative": ("trainable_relative", "TrainableRelativeEncoding"),
    "rope": ("rope", "RotaryOrderEncoding"),
    "cape": ("cape", "CapeEncoding"),
    "cape_paper": ("cape", "CapePaperEncoding"),
    "cape_additive": ("cape_additive", "CapeAdditiveEncoding"),
    "hope": ("hope", "HopeEncoding"),
    "tape": ("tape", "TapeEncoding"),
    "grape_m": ("grape_m", "GrapeMEncoding"),
    "grape_a": ("grape_a", "GrapeAEncoding"),
}

__all__ = [
    "EncodingContext",
    "GenePositions",
    "PositionalEncoding",
    "apply_planes",
    "apply_rotary",
    "attention_mask",
    "available",
    "get",
    "get_class",
]


def available() -> list[str]:
    """Registry names of every positional encoding, in a fixed order (cheapest first)."""
    return list(_REGISTRY)


def get_class(name: str) -> type[PositionalEncoding]:
    """The encoding class registered as ``name`` (CapeInputError listing the available ones otherwise)."""
    if name not in _REGISTRY:
        raise CapeInputError(f"unknown positional encoding '{name}'; available: {', '.join(available())}")
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(f".{module}", __name__), cls)


def get(name: str, **kwargs: Any) -> PositionalEncoding:
    """Build the encoding ``name``: ``get("cape", d_model=512, n_heads=8, n_layers=4, vocab_size=V,
    positions=GenePositions(...), **options)``."""
    return get_class(name)(**kwargs)
