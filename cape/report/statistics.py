"""Same-run comparisons for the verdict: the transformer minus its baseline on the same cells, with a seeded
bootstrap interval over the cells scored, as records and back."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

#: Bootstrap resamples of the test cells and the interval's coverage.
N_BOOTSTRAP = 1000


LEVEL = 0.95


# ---------------------------------------------------------------------------------------- comparisons on the same cells
def bootstrap_difference(y: Sequence, pred_a: Sequence, pred_b: Sequence,
                         score: Callable[[np.ndarray, np.ndarray], float], *, n_boot: int = N_BOOTSTRAP,
                         seed: int = 0, level: float = LEVEL) -> tuple[float, float, float]:
    """``score(y, a) - score(y, b)`` and its percentile bootstrap interval over cells (paired resampling).

    The interval reflects which cells happened to be tested, not the training seed: one run has one seed.
    """
    y, a, b = np.asarray(y), np.asarray(pred_a), np.asarray(pred_b)
    if not len(y) == len(a) == len(b) or len(y) == 0:
        raise ValueError(f"need equally long, non-empty labels and predictions, got {len(y)}, {len(a)}, {len(b)}")
    # One shared integer coding of all three (scores compare labels by equality), so resamples need no re-sorting.
    y, a, b = np.split(np.unique(np.concatenate([y.astype(str), a.astype(str), b.astype(str)]),
                                 return_inverse=True)[1].ravel(), 3)
    rng = np.random.default_rng(seed)
    diffs = np.empty(n_boot)
    for i in range(n_boot):
        idx = rng.integers(0, len(y), len(y))
        diffs[i] = score(y[idx], a[idx]) - score(y[idx], b[idx])
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(diffs, [tail, 100 - tail])
    return float(score(y, a) - score(y, b)), float(low), float(high)


def bootstrap_mean(differences: Sequence[float], *, n_boot: int = N_BOOTSTRAP, seed: int = 0,
                   level: float = LEVEL) -> tuple[float, float, float]:
    """The mean of paired differences (one per scored unit, e.g. per held-out perturbation) and its percentile
    bootstrap interval over the units; NaN bounds with fewer than two units."""
    d = np.asarray(differences, dtype=np.float64)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return float("nan"), float("nan"), float("nan")
    if d.size < 2:
        return float(d.mean()), float("nan"), float("nan")
    means = d[np.random.default_rng(seed).integers(0, d.size, (n_boot, d.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(d.mean()), float(low), float(high)


def accuracy(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.mean(np.asarray(y) == np.asarray(pred)))


def adjusted_rand(y: np.ndarray, clusters: np.ndarray) -> float:
    """Adjusted Rand index (Hubert & Arabie), as scikit-learn's ``adjusted_rand_score`` but ~50× faster on
    the small label sets of a report, which matters inside a 1,000-resample bootstrap."""
    yi, ci = _codes(y), _codes(clusters)
    n = yi.size
    table = np.bincount(yi * (ci.max() + 1) + ci, minlength=(yi.max() + 1) * (ci.max() + 1)).astype(np.float64)
    pairs = lambda counts: float((counts * (counts - 1)).sum() / 2)  # noqa: E731
    index = pairs(table)
    rows = pairs(table.reshape(yi.max() + 1, -1).sum(axis=1))
    cols = pairs(table.reshape(yi.max() + 1, -1).sum(axis=0))
    total = n * (n - 1) / 2
    expected = rows * cols / total if total else 0.0
    top = (rows + cols) / 2
    if top == expected:  # one cluster on both sides, or every cell alone on both: identical partitions
        return 1.0
    return (index - expected) / (top - expected)


def _codes(values: Sequence) -> np.ndarray:
    """Non-negative integer codes of labels (integer labels ≥ 0 are used as they are: empty codes count 0 pairs)."""
    values = np.asarray(values)
    if values.dtype.kind in "iu" and (values.size == 0 or values.min() >= 0):
        return values.astype(np.int64, copy=False)
    return np.unique(values, return_inverse=True)[1].ravel()


def comparison_records(task: str, metric: str, method: str, baseline: str, diff: tuple[float, float, float],
                       *, n_cells: int, dataset: str, seed: int, n_fine_tune: int | None = None) -> list[dict]:
    """Records ``task="comparison"``, method ``"<task> <metric>: <method> vs <baseline>"``: the difference, its
    bootstrap interval (``low``, ``high``), the cells resampled and, for annotation, the fine-tune cells."""
    values = {"difference": diff[0], "low": diff[1], "high": diff[2], "cells resampled": n_cells}
    if n_fine_tune is not None:
        values["fine-tune cells"] = n_fine_tune
    return [{"task": "comparison", "dataset": dataset, "method": f"{task} {metric}: {method} vs {baseline}",
             "seed": seed, "metric": k, "value": float(v)} for k, v in values.items()]


@dataclass(frozen=True)
class Comparison:
    """A method against a same-run baseline on one metric, with the bootstrap interval of the difference."""

    task: str
    metric: str
    method: str
    baseline: str
    value: float
    baseline_value: float
    diff: float
    low: float
    high: float
    n_cells: int


def comparisons_from_records(records: Iterable[dict]) -> list[Comparison]:
    """The :class:`Comparison` s stored by :func:`comparison_records`, with both scores from the same records."""
    records = list(records)
    by = {(r["task"], r["method"], r["metric"]): r["value"] for r in records}
    out = []
    for name in dict.fromkeys(r["method"] for r in records if r["task"] == "comparison"):
        head, pair = name.split(": ", 1)
        task, metric = head.split(" ", 1)
        method, baseline = pair.split(" vs ", 1)
        if (task, method, metric) not in by or (task, baseline, metric) not in by:
            continue
        get = {k: by[("comparison", name, k)] for k in ("difference", "low", "high", "cells resampled")}
        out.append(Comparison(task, metric, method, baseline, by[(task, method, metric)], by[(task, baseline, metric)],
                              get["difference"], get["low"], get["high"], int(get["cells resampled"])))
    return out
