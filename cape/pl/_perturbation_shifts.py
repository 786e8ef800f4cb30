"""``cape.pl.perturbation_shifts``: predicted against observed mean shifts over the top DE genes of perturbations."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .._errors import CapeInputError
from ..tasks.perturbation import condition_genes
from ._figure import checked_save_path, finish

__all__ = ["perturbation_shifts"]


def _checked(predicted, observed: pd.DataFrame, control_mean: pd.Series, de_genes: Mapping[str, Sequence[str]],
             conditions: Sequence[str] | None, n_conditions: int) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The predictors by name and the conditions to draw, after checking each has its means and DE genes."""
    named = dict(predicted) if isinstance(predicted, Mapping) else {"predicted": predicted}
    if not named:
        raise CapeInputError("no prediction to draw: predicted is an empty mapping")
    if conditions is None:
        if n_conditions < 1:
            raise CapeInputError(f"n_conditions must be at least 1, got {n_conditions}")
        # the largest observed effects over the DE genes: the panels where a predictor has most to get right
        scored = [c for c in map(str, observed.index) if c in de_genes]
        size = {c: float(np.sum((observed.loc[c, list(de_genes[c])].to_numpy(float)
                                 - control_mean[list(de_genes[c])].to_numpy(float)) ** 2)) for c in scored}
        ranked = sorted(scored, key=lambda c: -size[c])
        # singles and doubles in turn (as many of each as there are), so that both kinds are shown
        kinds = [[c for c in ranked if len(condition_genes(c)) == k] for k in (1, 2)]
        turns = [c for pair in zip(*kinds, strict=False) for c in pair]
        longer = max(kinds, key=len)[len(turns) // 2:] if kinds[0] and kinds[1] else ranked
        conditions = (turns + longer)[:n_conditions]
    conditions = [str(c) for c in conditions]
    if not conditions:
        raise CapeInputError("no condition to draw: observed has no condition with DE genes")
    for c in conditions:
        if c not in observed.index or c not in de_genes:
            raise CapeInputError(f"condition {c!r} has no observed mean or no DE genes")
        for name, frame in named.items():
            if c not in frame.index:
                raise CapeInputError(f"{name}: no prediction for condition {c!r}")
    genes = {g for c in conditions for g in de_genes[c]}
    for name, frame in [("observed", observed), ("control_mean", control_mean.to_frame().T), *named.items()]:
        absent = sorted(genes - set(map(str, frame.columns)))
        if absent:
            raise CapeInputError(f"{name} has no column for DE gene {absent[0]!r} ({len(absent)} missing)")
    return named, conditions


def _panel(ax, cond: str, named: dict[str, pd.DataFrame], observed: pd.DataFrame, control_mean: pd.Series,
           genes: list[str], colours: list) -> None:
    base = control_mean[genes].to_numpy(float)
    x = observed.loc[cond, genes].to_numpy(float) - base
    targets = np.isin(genes, condition_genes(cond))
    values = [x]
    for (name, frame), colour in zip(named.items(), colours, strict=False):
        y = frame.loc[cond, genes].to_numpy(float) - base
        values.append(y)
        ax.scatter(x, y, s=18, color=colour, alpha=0.8, label=name, zorder=3)
        if targets.any():
            ax.scatter(x[targets], y[targets], s=70, facecolors="none", edgecolors="black", linewidths=0.8,
                       zorder=4, label="perturbed gene")
    finite = np.concatenate(values)
    finite = finite[np.isfinite(finite)]
    reach = max(float(np.abs(finite).max(initial=0.0)), 1e-6) * 1.08
    ax.plot([-reach, reach], [-reach, reach], color="grey", lw=0.8, ls="--", zorder=1)
    ax.axhline(0, color="lightgrey", lw=0.6, zorder=0)
    ax.axvline(0, color="lightgrey", lw=0.6, zorder=0)
    ax.set_xlim(-reach, reach)
    ax.set_ylim(-reach, reach)
    ax.set_aspect("equal")
    ax.set_title(f"{cond} ({len(genes)} DE genes)", fontsize=9)
    ax.tick_params(labelsize=7)


def perturbation_shifts(predicted: pd.DataFrame | Mapping[str, pd.DataFrame], observed: pd.DataFrame,
                        control_mean: pd.Series, de_genes: Mapping[str, Sequence[str]], *,
                        conditions: Sequence[str] | None = None, n_conditions: int = 4, ax=None,
                        show: bool | None = None, return_fig: bool = False, title: str | None = None,
                        save: str | os.PathLike | None = None):
    """Predicted against observed change from the control mean over each condition's top DE genes, one panel each.

    A point is a gene: x its observed mean shift (condition mean − control mean), y the predicted one; points on the
    dashed diagonal are predicted exactly, points on the horizontal zero line are predicted not to move (the "no
    change" baseline), and a ring marks the condition's own perturbed gene(s). The inputs are those of
    :class:`cape.tasks.PerturbationTask`: ``predicted`` from a predictor's ``predict`` (or its ``evaluate``),
    ``task.truth``, ``task.control_mean`` and ``task.de``.

    Parameters
    ----------
    predicted
        Predicted mean expression, conditions × genes; or several predictors' as ``{name: DataFrame}``, drawn in
        different colours and named in the legend.
    observed
        Observed mean expression, conditions × genes.
    control_mean
        Mean expression of the control cells, by gene.
    de_genes
        Each condition's top DE genes (e.g. the top 20 against control), the genes drawn in its panel.
    conditions
        The conditions to draw; default the ``n_conditions`` with the largest observed shift over their DE genes
        (sum of squares).
    n_conditions
        How many conditions to draw when ``conditions`` is not given.
    ax
        ``None`` (a new figure, up to four panels a row) or one Axes per condition (a single Axes for one).
    show, return_fig, title
        scanpy conventions; ``title`` is the figure's title.
    save
        A file to write the figure to, its format from the suffix (``shifts.png``); the figure is then not shown
        unless ``show=True``.

    Reads
    -----
    No AnnData: tables of means, e.g. a predictor's ``predict``, ``PerturbationTask.truth``, ``.control_mean`` and
    ``.de``.

    Raises
    ------
    CapeInputError
        A condition without an observed mean, DE genes or a prediction; a DE gene missing from a table; fewer Axes
        than conditions.
    """
    save, owned = checked_save_path(save), ax is None
    named, conditions = _checked(predicted, observed, control_mean, de_genes, conditions, n_conditions)
    if ax is None:
        ncols = min(len(conditions), 4)
        nrows = -(-len(conditions) // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.1 * ncols, 3.1 * nrows + 0.5), squeeze=False)
        axes = list(axes.ravel())
        for extra in axes[len(conditions):]:
            extra.set_visible(False)
    else:
        axes = [ax] if hasattr(ax, "scatter") else list(ax)
        if len(axes) < len(conditions):
            raise CapeInputError(f"{len(conditions)} conditions to draw but {len(axes)} Axes given")
        fig = axes[0].figure
    nrows_drawn = -(-len(conditions) // 4) if ax is None else 1
    colours = [plt.get_cmap("tab10")(k % 10) for k in range(len(named))]
    for panel, cond in zip(axes, conditions, strict=False):
        _panel(panel, cond, named, observed, control_mean, [str(g) for g in de_genes[cond]], colours)
    axes[0].set_ylabel("predicted shift", fontsize=8)
    for panel in axes[: len(conditions)]:
        panel.set_xlabel("observed shift", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))  # "perturbed gene" once, whatever the number of predictors
    unique = {name: unique[name] for name in [*named, "perturbed gene"] if name in unique}
    fig.legend(unique.values(), unique.keys(), loc="lower center", ncol=min(len(unique), 5), fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(title or "predicted against observed shift from control, top DE genes", fontsize=10)
    fig.tight_layout(rect=(0, 0.14 / nrows_drawn, 1, 1))
    return finish(fig, save=save, show=show, return_fig=return_fig, owned=owned)
