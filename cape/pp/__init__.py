"""Preprocessing (scanpy under the hood)."""

from __future__ import annotations

from ._recipe import RARE_GENE_CELLS, detect_scale, preprocess

__all__ = ["RARE_GENE_CELLS", "detect_scale", "preprocess"]
