"""Progress bars that respect ``cape.settings`` (off when not on a terminal or when quiet)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

from ._settings import settings

T = TypeVar("T")


def progress(iterable: Iterable[T], *, desc: str | None = None, total: int | None = None,
             leave: bool = False) -> Iterator[T] | tqdm:
    """Wrap ``iterable`` in a tqdm bar when ``settings.show_progress()``; the bar object supports
    ``set_postfix`` either way."""
    return tqdm(iterable, desc=desc, total=total, leave=leave, disable=not settings.show_progress(),
                dynamic_ncols=True)
