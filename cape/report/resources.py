"""What each stage of a run cost: wall time and peak memory from Snakemake's ``benchmark:`` TSV files and from
this process."""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

logger = logging.getLogger("cape")

#: Snakemake rules whose ``logs/<run>/<stage>.tsv`` the report reads, in workflow order.
STAGES = ("preprocess", "causal", "embed", "encode", "train")


# ---------------------------------------------------------------------------------------------------- resources
def read_benchmark(path: str | os.PathLike) -> dict | None:
    """Wall seconds and peak resident memory (MB) from one Snakemake ``benchmark:`` TSV.

    Repeated measurements (``--benchmark-repeats``) give the mean time and the largest peak. ``None`` when the
    file is missing or unreadable; a column Snakemake wrote as ``NA`` (a job too short to sample) gives ``None``.
    """

    path = Path(path)
    if not path.is_file():
        return None
    try:
        frame = pd.read_csv(path, sep="\t", na_values=["NA", "-"])
    except (OSError, ValueError, pd.errors.ParserError) as err:
        logger.warning("cannot read benchmark file %s: %s", path, err)
        return None

    def column(name: str, how: str) -> float | None:
        if name not in frame:
            return None
        values = pd.to_numeric(frame[name], errors="coerce").dropna()
        return float(getattr(values, how)()) if len(values) else None

    return {"seconds": column("s", "mean"), "max_rss_mb": column("max_rss", "max")}


def stage_resources(bench_dir: str | os.PathLike | None, stages: Sequence[str] = STAGES) -> list[dict]:
    """One row ``{stage, seconds, max_rss_mb, source}`` per stage; unmeasured values are ``None``."""
    rows = []
    for stage in stages:
        found = read_benchmark(Path(bench_dir) / f"{stage}.tsv") if bench_dir is not None else None
        rows.append({"stage": stage, **(found or {"seconds": None, "max_rss_mb": None}),
                     "source": "Snakemake benchmark" if found else "not measured"})
    return rows


def own_peak_rss_mb() -> float:
    """Peak resident memory of this process so far (``resource.getrusage``), in MB (MiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def process_seconds() -> float | None:
    """Wall seconds since this process started (imports included); ``None`` where unknown."""
    try:
        import psutil  # optional dependency (installed with snakemake, not required by cape)
    except ImportError:
        return None
    return time.time() - psutil.Process().create_time()


def own_resources(stage: str = "evaluate") -> dict:
    """This process's row: its own peak from ``resource.getrusage`` (Snakemake's file is written after it ends)."""
    return {"stage": stage, "seconds": process_seconds(), "max_rss_mb": own_peak_rss_mb(),
            "source": "this process (resource.getrusage)"}


def resource_records(rows: Iterable[dict], *, dataset: str, seed: int) -> list[dict]:
    """Records ``task="resources"`` for metrics.json; values that were not measured are left out."""
    return [{"task": "resources", "dataset": dataset, "method": row["stage"], "seed": seed, "metric": metric,
             "value": float(row[metric]), "source": row["source"]}
            for row in rows for metric in ("seconds", "max_rss_mb") if row.get(metric) is not None]


def resources_from_records(records: Iterable[dict]) -> list[dict]:
    """The rows of :func:`stage_resources` back from ``task="resources"`` records (unmeasured stages absent)."""
    rows: dict[str, dict] = {}
    for r in records:
        if r["task"] == "resources":
            row = rows.setdefault(r["method"], {"stage": r["method"], "seconds": None, "max_rss_mb": None,
                                                "source": r.get("source", "")})
            row[r["metric"]] = r["value"]
    return list(rows.values())


def resources_table(rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-stage table (time, peak memory, where the numbers come from)."""
    def fmt(v: float | None, unit: str) -> str:
        return "not measured" if v is None else f"{v:,.1f} {unit}"

    return (["stage", "time", "peak memory (max RSS)", "measured by"],
            [[r["stage"], fmt(r["seconds"], "s"), fmt(r["max_rss_mb"], "MB"), r["source"]] for r in rows])
