"""``cape.pl.intervention``: the genes with the largest predicted mean shift under an intervention."""

from __future__ import annotations

import os

import matplotlib.pyplot as plt
import numpy as np

from .._errors import CapeInputError
from ._figure import checked_save_path, finish

__all__ = ["intervention"]


def intervention(adata, *, key: str = "cape_intervention", n_genes: int = 20, ax=None, show: bool | None = None,
                 return_fig: bool = False, title: str | None = None, save: str | os.PathLike | None = None):
    """Horizontal bars of the ``n_genes`` largest predicted mean shifts (``|shift|``), intervened genes left out.

    For ``equations="equivalence_class"`` each bar is the mean over the intervened gene's possible parent sets
    and a whisker spans the shifts under them (``uns[key]["shift_per_parent_set"]``): how much the prediction
    depends on the orientations the cells cannot decide.

    Parameters
    ----------
    adata
        AnnData (or the predicted cells) holding ``uns[key]`` and ``var[f"{key}_shift"]`` from
        :func:`cape.tl.predict_intervention`.
    n_genes
        How many genes to show.
    ax, show, return_fig, title
        scanpy conventions.
    save
        A file to write the figure to, its format from the suffix (``intervention.png``); the figure is then not shown
        unless ``show=True``.

    Reads
    -----
    ``var["cape_intervention_shift"]`` (``f"{key}_shift"``) and ``uns["cape_intervention"]`` (``key``).
    """
    save, owned = checked_save_path(save), ax is None
    column = f"{key}_shift"
    if key not in adata.uns or column not in adata.var:
        raise CapeInputError(f"uns[{key!r}] / var[{column!r}] not found: run cape.tl.predict_intervention first")
    intervened = dict(adata.uns[key].get("intervention", {}))
    shift = adata.var[column].astype(float)
    shift = shift[~shift.index.isin(list(intervened)) & (shift != 0)]
    top = shift.iloc[np.argsort(-np.abs(shift.to_numpy()), kind="stable")[:n_genes]][::-1]
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(5, 0.8 + 0.25 * max(len(top), 1)))
    else:
        fig = ax.figure
    label = ", ".join(f"{g}={float(v):.3g}" for g, v in intervened.items())
    per_set = adata.uns[key].get("shift_per_parent_set")
    if len(top):
        ax.barh(np.arange(len(top)), top.to_numpy(), color=["tab:red" if v > 0 else "tab:blue" for v in top])
        if per_set is not None:
            # IDA: the bar is the mean over the parent sets the class allows; the whisker spans them
            spread = np.asarray(per_set, dtype=float)[:, adata.var_names.get_indexer(top.index)]
            values = top.to_numpy()
            ax.errorbar(values, np.arange(len(top)), xerr=[values - spread.min(0), spread.max(0) - values],
                        fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
        ax.set_yticks(np.arange(len(top)), list(map(str, top.index)), fontsize=8)
    else:
        ax.text(0.5, 0.5, "no gene downstream: the prediction is the no-change baseline", ha="center",
                va="center", transform=ax.transAxes, fontsize=8)
        ax.set_yticks([])
    ax.axvline(0, color="black", lw=0.8)
    mode = adata.uns[key].get("mode", "")
    ax.set_xlabel(f"predicted mean shift ({mode}, {adata.uns[key].get('equations', '')} equations)"
                  + ("\nwhiskers: range over the parent sets the class allows" if per_set is not None else ""))
    ax.set_title(title or f"do({label})")
    return finish(fig, save=save, show=show, return_fig=return_fig, owned=owned)
