"""Preprocessing (scanpy under the hood)."""

from __future__ import annotations

from ._recipe import N_TOP_GENES, detect_scale, preprocess

__all__ = ["N_TOP_GENES", "detect_scale", "preprocess"]
