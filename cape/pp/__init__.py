"""Preprocessing (scanpy under the hood)."""

from __future__ import annotations

from ._recipe import detect_scale, preprocess

__all__ = ["detect_scale", "preprocess"]
