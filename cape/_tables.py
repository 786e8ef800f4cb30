"""Tables of records (one dict per measured value): ``mean ± sd`` over seeds in markdown, markdown and HTML
tables, and a small HTML page for Snakemake's report."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence

import pandas as pd


# ---------------------------------------------------------------------------------------------------- tables
def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def parse_markdown_table(text: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a pipe table as :func:`mean_sd_table` writes it."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip().startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return cells[0], [c for c in cells[2:]]


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html_page(title: str, body: str) -> str:
    style = ("body{font-family:sans-serif;max-width:60em;margin:1em auto;line-height:1.4}"
             "table{border-collapse:collapse;margin:0.5em 0 1.5em}th,td{border:1px solid #bbb;padding:2px 8px;"
             "text-align:left}th{background:#eee}code{background:#f4f4f4}")
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{style}</style></head><body>{body}</body></html>\n")


def _inline(text: str) -> str:
    """Escape ``text`` and turn markdown `code` spans into <code>."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


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
