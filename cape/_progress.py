"""Progress of long loops, as ``cape.settings`` asks: a tqdm bar where one can be drawn (a terminal, a notebook),
else a log line now and then (a script whose stderr is a file or a pipe, the command line under Snakemake), or
nothing (``verbosity`` 0, ``progress=False``)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from tqdm.auto import tqdm

from ._settings import PROGRESS, settings

T = TypeVar("T")

logger = logging.getLogger("cape")

#: Seconds between two progress lines (the first and the last iteration are always reported).
LINE_INTERVAL = 10.0


def progress(iterable: Iterable[T], *, desc: str | None = None, total: int | None = None, leave: bool = False,
             unit: str = "step", lines: bool = True) -> Iterator[T] | tqdm | ProgressLines:
    """Wrap ``iterable`` as :meth:`settings.progress_mode() <cape._settings.CapeSettings.progress_mode>` says: a
    tqdm bar, :class:`ProgressLines`, or a disabled bar. The object supports ``set_postfix`` and ``close`` either
    way. ``unit`` names one iteration in lines (``"epoch"``); ``lines=False`` keeps a short loop (inference
    batches) to a bar, without lines."""
    mode = settings.progress_mode()
    if mode == "lines" and lines:
        return ProgressLines(iterable, desc=desc or "progress", total=total, unit=unit)
    bar = _bar_class() if mode == "bar" else tqdm
    return bar(iterable, desc=desc, total=total, leave=leave, disable=mode != "bar", dynamic_ncols=True)


def _bar_class() -> type:
    """tqdm.auto's bar, or the text bar in a notebook without ipywidgets (the widget bar would raise)."""
    if settings.in_notebook():
        try:
            import ipywidgets  # noqa: F401
        except ImportError:
            from tqdm.std import tqdm as text_bar
            return text_bar
    return tqdm


def format_seconds(seconds: float) -> str:
    """``"42 s"``, ``"3 min 05 s"``, ``"1 h 02 min"``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class ProgressLines:
    """A bar's stand-in where none can be drawn: one log line (level ``PROGRESS``, shown from ``verbosity`` 1)
    after the first iteration, after the last, and at most one per ``interval`` seconds between, with the last
    ``set_postfix`` values (losses, validation scores), the time spent and the time left at this pace.

    A loop left early (early stopping) gets its last line from :meth:`close`; one left by an exception gets none.
    """

    def __init__(self, iterable: Iterable[T], *, desc: str, total: int | None = None, unit: str = "step",
                 interval: float = LINE_INTERVAL, clock: Callable[[], float] = time.monotonic) -> None:
        self.iterable, self.desc, self.unit, self.interval, self.clock = iterable, desc, unit, interval, clock
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total = total
        self.n, self.postfix = 0, {}
        self._start: float | None = None
        self._last_line = -math.inf
        self._reported, self._closed = 0, False

    def __len__(self) -> int:
        return int(self.total or 0)

    def __iter__(self) -> Iterator[T]:
        self._start = self.clock()
        for item in self.iterable:
            self.n += 1
            yield item
            # the loop's body has run (and set its postfix): report the iteration just finished
            now = self.clock()
            if self.n == 1 or now - self._last_line >= self.interval:
                self._line(now)
        self.close()

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        self.postfix = {**(ordered_dict or {}), **kwargs}

    def close(self) -> None:
        """The last line (unless the last iteration was just reported)."""
        if self._closed:
            return
        self._closed = True
        if self.n > self._reported:
            self._line(self.clock(), last=True)

    def _line(self, now: float, last: bool = False) -> None:
        elapsed = now - (self._start if self._start is not None else now)
        done = self.total is not None and self.n >= self.total
        count = f"{self.unit} {self.n}/{self.total}" if self.total else f"{self.n} {self.unit}s"
        parts = [count, *(f"{k} {_short(v)}" for k, v in self.postfix.items())]
        if last or done:
            parts.append(f"{format_seconds(elapsed)} in all")
        else:
            parts.append(f"{format_seconds(elapsed)} elapsed")
            if self.total:
                left = elapsed / self.n * (self.total - self.n)
                parts.append(f"at most {format_seconds(left)} left")
        logger.log(PROGRESS, "%s: %s", self.desc, ", ".join(parts))
        self._last_line, self._reported = now, self.n


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
