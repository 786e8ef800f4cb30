"""Benchmark outputs shared by every runner: a list of flat records → JSON, a mean ± sd markdown table."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from .._io import atomic_path


def records_frame(records: Iterable[dict]) -> pd.DataFrame:
    """Records (one dict per measured value, with a ``value`` field) as a DataFrame."""
    frame = pd.DataFrame(list(records))
    if frame.empty or "value" not in frame.columns:
        raise ValueError("benchmark produced no records with a 'value' field")
    return frame


def mean_sd_table(records: Iterable[dict], rows: Sequence[str], columns: Sequence[str] = ("metric",),
                  digits: int = 3) -> str:
    """Markdown table of ``mean ± sd`` (sd over the remaining keys, usually seeds), one row per ``rows`` key.

    A cell with a single value shows just the value; ``n`` is not shown when every cell has the same count.
    """
    frame = records_frame(records)
    grouped = frame.groupby([*rows, *columns], sort=False)["value"]
    stats = grouped.agg(["mean", "std", "count"]).reset_index()

    def fmt(r: pd.Series) -> str:
        if pd.isna(r["mean"]):
            return "–"
        if r["count"] > 1 and not math.isnan(r["std"]):
            return f"{r['mean']:.{digits}g} ± {r['std']:.{digits}g}"
        return f"{r['mean']:.{digits}g}"

    stats["cell"] = stats.apply(fmt, axis=1)
    wide = stats.pivot_table(index=list(rows), columns=list(columns), values="cell", aggfunc="first", sort=False)
    wide.columns = [" / ".join(map(str, c)) if isinstance(c, tuple) else str(c) for c in wide.columns]
    wide = wide.reset_index().fillna("–")
    header = "| " + " | ".join(wide.columns) + " |"
    sep = "|" + "|".join("---" for _ in wide.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in wide.itertuples(index=False)]
    return "\n".join([header, sep, *body])


def write_json(records: list[dict], path: str | os.PathLike) -> Path:
    """Write records as a JSON list, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(records, indent=1, default=_jsonable))
    return Path(path)


def write_text(text: str, path: str | os.PathLike) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def save_figure(fig, path: str | os.PathLike, dpi: int = 150) -> Path:
    """Save a matplotlib figure atomically (png by the target's suffix)."""
    target = Path(path)
    with atomic_path(target) as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format=target.suffix.lstrip(".") or "png")
    return target


def _jsonable(obj):
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)
