"""Plots of the Step II embedding: genes in the Poincaré disk with the DAG's edges, and generality."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import anndata as ad
import matplotlib.pyplot as plt
import numpy as np
import scipy.sparse as sp
from matplotlib.collections import LineCollection
from matplotlib.colors import LogNorm
from matplotlib.lines import Line2D
from scipy.stats import spearmanr

from .._errors import CapeInputError
from ._figure import checked_save_path, finish
from ._labels import place_labels

logger = logging.getLogger("cape")


def _positions(adata: ad.AnnData, basis: str) -> np.ndarray:
    if basis not in adata.varm:
        raise CapeInputError(f"varm[{basis!r}] not found: embed the causal graph first with `cape embed` "
                             "(cape.tl.hyperbolic_embedding)")
    return np.asarray(adata.varm[basis], dtype=np.float64)


def _colours(adata: ad.AnnData, color: str | None):
    """(values, is_numeric) for a var column, or (None, False)."""
    if color is None:
        return None, False
    if color not in adata.var:
        raise CapeInputError(f"color={color!r} is not a column of adata.var")
    values = adata.var[color]
    return values.to_numpy(), np.issubdtype(values.dtype, np.number) and values.dtype != bool


def poincare(adata: ad.AnnData, color: str | None = "cape_generality", *, edges: bool = True,
             basis: str = "cape_poincare", dag_key: str = "cape_dag", radius: str = "norm",
             components: Sequence[int] | None = None, labels: bool | int | None = None, only_embedded: bool = True,
             seed: int = 0, ax=None, show: bool | None = None, return_fig: bool = False, title: str | None = None,
             save: str | os.PathLike | None = None,
             cmap: str = "viridis"):
    """Genes in the Poincaré disk: radius from each gene's true norm ‖e‖, angle from its direction.

    The embedding may have any dimension d. A gene's radius is ‖e‖ (``radius="norm"``), or its hyperbolic
    distance from the origin ``2·artanh‖e‖`` scaled to the disk (``radius="distance"``, which spreads genes
    crowded near the rim). Its angle is that of its direction e/‖e‖ projected on the first two principal axes of
    all directions (d > 2), or on the coordinates ``components``; for d = 2 it is the true angle, and the plot is
    the embedding itself. The DAG's edges are drawn faintly; the most general genes are drawn on top and named.

    Parameters
    ----------
    adata
        AnnData with ``varm[basis]`` (from :func:`cape.tl.hyperbolic_embedding`).
    color
        ``var`` column to colour by (default the generality π, on a log scale when it spans over a decade);
        ``None`` for one colour.
    edges
        Draw the edges of ``varp[dag_key]``.
    radius
        ``"norm"`` (the true ‖e‖) or ``"distance"`` (hyperbolic distance from the origin, divided by the largest).
    components
        Two coordinates whose plane gives the angles (default: the principal axes of the directions).
    labels
        How many of the most general genes to name (``var["cape_generality"]``, else the nearest the origin);
        ``True`` all, ``False`` none, default 10. A label with no free spot is left out.
    only_embedded
        Hide genes with ``var["cape_embedded"] == False`` (they sit at the origin).
    seed
        Seed of the principal axes' sign, so that the same embedding gives the same picture.
    ax
        Matplotlib axes to draw into.
    show, return_fig, title, cmap
        scanpy conventions.
    save
        A file to write the figure to, its format from the suffix (``poincare.png``); the figure is then not shown
        unless ``show=True``.

    Reads
    -----
    ``varm["cape_poincare"]`` (``basis``), ``varp["cape_dag"]`` (``dag_key``), ``var["cape_generality"]``
    (``color``) and ``var["cape_embedded"]``.
    """
    save, owned = checked_save_path(save), ax is None

    if radius not in ("norm", "distance"):
        raise CapeInputError(f"radius must be 'norm' or 'distance', got {radius!r}")
    pos = _positions(adata, basis)
    d = pos.shape[1]
    if components is not None:
        components = list(components)
        if len(components) != 2 or max(components) >= d or min(components) < 0:
            raise CapeInputError(f"components must pick 2 of the {d} coordinates, got {components}")
    keep = np.ones(adata.n_vars, dtype=bool)
    if only_embedded and "cape_embedded" in adata.var:
        keep = adata.var["cape_embedded"].to_numpy(dtype=bool)
    if not keep.any():
        raise CapeInputError("no gene is embedded (var['cape_embedded'] is all False): nothing to draw")
    norm = np.linalg.norm(pos, axis=1)
    angle = _angles(pos, keep, components, seed)
    if radius == "norm":
        r = norm
    else:
        distance = 2 * np.arctanh(np.clip(norm, 0, 1 - 1e-12))
        r = distance / max(float(distance[keep].max()), 1e-12)
    xy = np.column_stack([r * np.cos(angle), r * np.sin(angle)])
    values, numeric = _colours(adata, color)

    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 6))
    else:
        fig = ax.figure
    ax.add_patch(plt.Circle((0, 0), 1.0, fill=False, color="0.3", lw=1))
    ring_notes = _rings(ax, radius, distance[keep].max() if radius == "distance" else None)
    if edges and dag_key in adata.varp:
        coo = sp.coo_matrix(adata.varp[dag_key])
        both = keep[coo.row] & keep[coo.col] & (coo.data != 0)
        segments = np.stack([xy[coo.row[both]], xy[coo.col[both]]], axis=1)
        ax.add_collection(LineCollection(segments, colors="0.4", linewidths=0.5, alpha=0.25, zorder=1))
    _draw_genes(ax, xy, np.flatnonzero(keep), values, numeric, color, cmap)
    what = ("radius: ‖e‖, the true norm in the Poincaré ball" if radius == "norm" else
            "radius: hyperbolic distance from the origin, 2·artanh‖e‖, over its largest value")
    how = ("angle: the embedding's own" if d == 2 and components is None else
           f"angle: coordinates {components[0]} and {components[1]} of e/‖e‖" if components is not None else
           f"angle: e/‖e‖ on its first two principal axes (d = {d})")
    ax.set_xlabel(f"{what}; {how}", fontsize=8)
    ax.set_title(title or f"{keep.sum()} genes in the Poincaré disk ({basis}), ‖e‖ from "
                 f"{norm[keep].min():.2f} to {norm[keep].max():.2f}", fontsize=10)
    n_labels = keep.sum() if labels is True else 0 if labels is False else 10 if labels is None else int(labels)
    rank = (adata.var["cape_generality"].to_numpy(float) if "cape_generality" in adata.var else -norm)
    named = np.flatnonzero(keep)[np.argsort(-rank[keep], kind="stable")[:n_labels]]
    place_labels(ax, xy[named], [str(adata.var_names[i]) for i in named], outward=xy[named],
                 obstacles=xy[keep], marker_pt=2.5, avoid=ring_notes)
    return finish(fig, save=save, show=show, return_fig=return_fig, owned=owned)


def _draw_genes(ax, xy: np.ndarray, shown: np.ndarray, values, numeric: bool, color: str | None, cmap: str) -> None:
    """The genes ``shown`` as points at ``xy`` coloured by ``values`` (a colourbar, a legend or one colour), on a
    bare, square disk."""
    kwargs = {"s": 16, "edgecolors": "k", "linewidths": 0.2, "zorder": 3, "gid": POINTS_GID}
    if values is not None and numeric:
        c = values.astype(float)
        shown = shown[np.argsort(c[shown], kind="stable")]  # high values drawn last, on top
        sc = ax.scatter(*xy[shown].T, c=c[shown], cmap=cmap, norm=_colour_scale(c[shown]), **kwargs)
        ax.figure.colorbar(sc, ax=ax, shrink=0.7, label=_COLOUR_NAMES.get(color, color))
    elif values is not None:
        categories = values.astype(str)
        names = list(np.unique(categories[shown]))
        ax.scatter(*xy[shown].T, color=[f"C{names.index(c) % 10}" for c in categories[shown]], **kwargs)
        ax.legend(handles=[Line2D([], [], ls="", marker="o", color=f"C{k % 10}", label=name)
                           for k, name in enumerate(names)], fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    else:
        ax.scatter(*xy[shown].T, color="C0", **kwargs)
    ax.set_aspect("equal")
    ax.set_xlim(-1.08, 1.08)
    ax.set_ylim(-1.08, 1.08)
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)


#: gid of the genes' markers (one PathCollection), so that tests can read the positions drawn.
POINTS_GID = "cape_poincare_genes"
_COLOUR_NAMES = {"cape_generality": "generality π (PageRank)"}


def _angles(pos: np.ndarray, keep: np.ndarray, components: list[int] | None, seed: int) -> np.ndarray:
    """Angle of each gene's direction in a plane: its own (d = 2), two coordinates, or the principal axes."""

    norm = np.linalg.norm(pos, axis=1, keepdims=True)
    unit = np.divide(pos, norm, out=np.zeros_like(pos), where=norm > 0)
    if components is not None:
        plane = unit[:, components]
    elif pos.shape[1] == 2:
        plane = unit
    else:
        centred = unit[keep] - unit[keep].mean(axis=0)
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        axes = vt[:2]
        # an axis's sign is arbitrary: fix it by a seeded reference direction, the same for every run
        reference = np.random.default_rng(seed).standard_normal(pos.shape[1])
        axes = axes * np.where(axes @ reference < 0, -1.0, 1.0)[:, None]
        plane = unit @ axes.T
    return np.arctan2(plane[:, 1], plane[:, 0])


def _colour_scale(values: np.ndarray):
    """Log scale for positive values spanning over a decade (PageRank's is heavy-tailed), else linear."""

    if values.size and values.min() > 0 and values.max() > 10 * values.min():
        return LogNorm(values.min(), values.max())
    return None


def _rings(ax, radius: str, largest_distance: float | None) -> list:
    """Dashed circles that let the reader read a gene's radius off the disk; the texts that name them."""

    if radius == "norm":
        # 0.9 and 0.99 lie too close for a text on each: one note names them all
        rings = [0.5, 0.9, 0.99]
        notes = [ax.text(0.0, 0.0, "dashed circles: ‖e‖ = 0.5, 0.9, 0.99", transform=ax.transAxes, fontsize=7,
                         color="0.3", ha="left", va="bottom")]
    else:
        step = 1.0 if largest_distance <= 6 else 2.0
        distances = np.arange(step, largest_distance, step)
        rings = list(distances / largest_distance)
        notes = [ax.text(r * np.cos(np.pi / 4), r * np.sin(np.pi / 4), f"d = {t:g}", fontsize=6, color="0.4",
                         ha="left", va="bottom") for r, t in zip(rings, distances, strict=True)]
    for r in rings:
        ax.add_patch(plt.Circle((0, 0), r, fill=False, color="0.6", lw=0.6, ls="--", zorder=0))
    return notes


def generality(adata: ad.AnnData, *, basis: str = "cape_poincare", key: str = "cape_generality",
               labels: int = 10, ax=None, show: bool | None = None, return_fig: bool = False,
               save: str | os.PathLike | None = None):
    """Causal generality π (PageRank, Eq. 18) against the distance from the origin ‖e‖ of every gene.

    General genes (high π) should sit near the origin; the title gives Spearman(π, −‖e‖). The ``labels``
    genes with the highest π are named.

    Parameters
    ----------
    adata
        AnnData after :func:`cape.tl.hyperbolic_embedding`.
    basis
        ``varm`` key of the Poincaré coordinates.
    key
        ``var`` column of the generality π.
    labels
        How many of the most general genes to name.
    ax, show, return_fig
        scanpy conventions.
    save
        A file to write the figure to, its format from the suffix (``generality.png``); the figure is then not shown
        unless ``show=True``.

    Reads
    -----
    ``varm["cape_poincare"]`` (``basis``) and ``var["cape_generality"]`` (``key``).
    """
    save, owned = checked_save_path(save), ax is None

    pos = _positions(adata, basis)
    if key not in adata.var:
        raise CapeInputError(f"var[{key!r}] not found: run `cape embed` (cape.tl.hyperbolic_embedding)")
    keep = np.ones(adata.n_vars, dtype=bool)
    if "cape_embedded" in adata.var:
        keep = adata.var["cape_embedded"].to_numpy(dtype=bool)
    pi = adata.var[key].to_numpy(dtype=float)
    norm = np.linalg.norm(pos, axis=1)
    if ax is None:
        fig, ax = plt.subplots(figsize=(4.5, 3.8))
    else:
        fig = ax.figure
    ax.scatter(norm[keep], pi[keep], s=14, color="C0", edgecolors="k", linewidths=0.2)
    for i in np.flatnonzero(keep)[np.argsort(-pi[keep])[:labels]]:
        ax.annotate(str(adata.var_names[i]), (norm[i], pi[i]), fontsize=7, xytext=(3, 2),
                    textcoords="offset points")
    rho = spearmanr(pi[keep], -norm[keep]).statistic if keep.sum() > 2 else float("nan")
    ax.set_xlabel("‖e‖ (distance from the origin in the Poincaré ball)")
    ax.set_ylabel("generality π (PageRank)")
    ax.set_yscale("log")
    ax.set_title(f"Spearman(π, −‖e‖) = {rho:.2f}")
    return finish(fig, save=save, show=show, return_fig=return_fig, owned=owned)
