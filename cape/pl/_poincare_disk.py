"""Plots of the Step II embedding: genes in the Poincaré disk/ball with the DAG's edges, and generality."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anndata as ad
import matplotlib.pyplot as plt
import numpy as np
import scipy.sparse as sp
from scipy.stats import spearmanr

from .._errors import CapeInputError

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
             basis: str = "cape_poincare", dag_key: str = "cape_dag", components: Sequence[int] | None = None,
             labels: bool | None = None, only_embedded: bool = True, ax=None, show: bool | None = None,
             return_fig: bool = False, title: str | None = None, cmap: str = "viridis"):
    """Genes in the Poincaré disk (d = 2) or ball (d ≥ 3, first three or ``components``) with the DAG's edges.

    Parameters
    ----------
    adata
        AnnData with ``varm[basis]`` (from :func:`cape.tl.hyperbolic_embedding`).
    color
        ``var`` column to colour by (default the generality π); ``None`` for one colour.
    edges
        Draw the edges of ``varp[dag_key]`` (arrows in 2-D, lines in 3-D).
    components
        Which 2 or 3 coordinates to show (default: all when d ≤ 3, else the first three).
    labels
        Write gene names next to the points (default: when at most 30 genes are shown).
    only_embedded
        Hide genes with ``var["cape_embedded"] == False`` (they sit at the origin).
    ax
        Matplotlib axes to draw into (3-D axes for a ball).
    show, return_fig
        Show the figure / return it (scanpy conventions).

    Reads
    -----
    ``varm["cape_poincare"]`` (``basis``), ``varp["cape_dag"]`` (``dag_key``), ``var["cape_generality"]``
    (``color``) and ``var["cape_embedded"]``.
    """

    pos = _positions(adata, basis)
    d = pos.shape[1]
    if components is None:
        components = list(range(min(d, 3)))
    components = list(components)
    if len(components) not in (2, 3) or max(components) >= d or min(components) < 0:
        raise CapeInputError(f"components must pick 2 or 3 of the {d} coordinates, got {components}")
    if d > len(components):
        logger.info("showing coordinates %s of %d", components, d)
    keep = np.ones(adata.n_vars, dtype=bool)
    if only_embedded and "cape_embedded" in adata.var:
        keep = adata.var["cape_embedded"].to_numpy(dtype=bool)
    xyz = pos[:, components]
    values, numeric = _colours(adata, color)
    three_d = len(components) == 3
    if ax is None:
        fig = plt.figure(figsize=(5.5, 5))
        ax = fig.add_subplot(111, projection="3d" if three_d else None)
    else:
        fig = ax.figure
    if three_d:
        u, v = np.mgrid[0:2 * np.pi:30j, 0:np.pi:15j]
        ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85", lw=0.4)
    else:
        ax.add_patch(plt.Circle((0, 0), 1.0, fill=False, color="0.5", lw=1))
        ax.set_aspect("equal")
    if edges and dag_key in adata.varp:
        coo = sp.coo_matrix(adata.varp[dag_key])
        for i, j in zip(coo.row, coo.col, strict=True):
            if not (keep[i] and keep[j]):
                continue
            if three_d:
                ax.plot(*zip(xyz[i], xyz[j], strict=True), color="0.45", lw=0.6, alpha=0.7)
            else:
                ax.annotate("", xy=xyz[j], xytext=xyz[i],
                            arrowprops={"arrowstyle": "->", "color": "0.45", "lw": 0.6, "alpha": 0.7})
    kwargs = {"s": 30, "edgecolors": "k", "linewidths": 0.3, "zorder": 3}
    if values is not None and numeric:
        sc = ax.scatter(*xyz[keep].T, c=values[keep].astype(float), cmap=cmap, **kwargs)
        fig.colorbar(sc, ax=ax, shrink=0.7, label=color)
    elif values is not None:
        for k, cat in enumerate(np.unique(values[keep].astype(str))):
            mask = keep & (values.astype(str) == cat)
            ax.scatter(*xyz[mask].T, color=f"C{k % 10}", label=cat, **kwargs)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    else:
        ax.scatter(*xyz[keep].T, color="C0", **kwargs)
    if labels is None:
        labels = keep.sum() <= 30
    if labels:
        for i in np.flatnonzero(keep):
            ax.text(*(xyz[i] * 1.04), str(adata.var_names[i]), fontsize=7)
    lim = (-1.05, 1.05)
    ax.set_xlim(*lim)
    ax.set_ylim(*lim)
    if three_d:
        ax.set_zlim(*lim)
    ax.set_title(title or f"Poincaré {'ball' if three_d else 'disk'} ({basis})")
    if show:
        plt.show()
    return fig if return_fig else None


def generality(adata: ad.AnnData, *, basis: str = "cape_poincare", key: str = "cape_generality",
               labels: int = 10, ax=None, show: bool | None = None, return_fig: bool = False):
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

    Reads
    -----
    ``varm["cape_poincare"]`` (``basis``) and ``var["cape_generality"]`` (``key``).
    """

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
    if show:
        plt.show()
    return fig if return_fig else None
