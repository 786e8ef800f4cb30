"""``cape.pl.dag_comparison``: true vs inferred causal graph (paper Fig. 3a/b)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
import scipy.sparse as sp

from .._arrays import dense
from ._figure import checked_save_path, finish

__all__ = ["MAX_NODES", "dag_comparison"]

logger = logging.getLogger("cape")

#: Most genes drawn (and densified): above, only genes with an edge in either graph, then the MAX_NODES of highest
#: degree in their union. An adjacency image of 30,000 genes would take gigabytes and show nothing.
MAX_NODES = 1000


def _restrict(true, estimated, labels: list[str] | None) -> tuple:
    """The two graphs (still sparse or as given) on at most :data:`MAX_NODES` nodes, and their labels."""
    T, E = sp.csr_matrix(true), sp.csr_matrix(estimated)
    if T.shape != E.shape:
        return true, estimated, labels  # the shape check below names the problem
    union = ((T != 0) + (E != 0)).astype(np.int64)
    degree = np.asarray(union.sum(0)).ravel() + np.asarray(union.sum(1)).ravel()
    keep = np.flatnonzero(degree > 0)
    if keep.size > MAX_NODES:
        keep = np.sort(keep[np.argsort(-degree[keep], kind="stable")[:MAX_NODES]])
    logger.info("dag_comparison: %d genes; drawing the %d with an edge (at most %d, by degree)",
                T.shape[0], keep.size, MAX_NODES)
    labels = labels if labels is not None else [str(i) for i in range(T.shape[0])]
    return T[keep][:, keep], E[keep][:, keep], [labels[i] for i in keep]


def dag_comparison(true, estimated, labels: Sequence[str] | None = None, *, titles=("true", "inferred"),
                   show: bool | None = None, return_fig: bool = False, save: str | os.PathLike | None = None):
    """Draw the true and the inferred DAG (top) and their weighted adjacency matrices (bottom).

    Parameters
    ----------
    true, estimated
        Square weighted adjacency matrices (NumPy or SciPy sparse; A[i, j] ≠ 0 means i → j), e.g.
        ``adata.varp["true_dag"]`` and ``adata.varp["cape_dag"]``.
    labels
        Node names (default 0 … M−1).
    titles
        Titles of the two columns.
    show, return_fig, save
        As in scanpy: show the figure (default when neither returning nor saving it), or return it;
        ``save`` writes it to that file, its format from the suffix (``comparison.png``).

    Notes
    -----
    Graphs of more than :data:`MAX_NODES` genes are drawn on the genes with an edge in either graph (at most
    MAX_NODES of them, by degree), with a log line; they are never densified whole.

    Reads
    -----
    No AnnData: two matrices, e.g. ``varp["true_dag"]`` and ``varp["cape_dag"]``.
    """
    save = checked_save_path(save)

    labels = [str(x) for x in labels] if labels is not None else None
    if true.shape[0] > MAX_NODES:
        true, estimated, labels = _restrict(true, estimated, labels)
    T, E = dense(true), dense(estimated)
    if T.shape != E.shape or T.ndim != 2 or T.shape[0] != T.shape[1]:
        raise ValueError(f"true and estimated must be square and of equal shape, got {T.shape} and {E.shape}")
    M = T.shape[0]
    labels = [str(x) for x in labels] if labels is not None else [str(i) for i in range(M)]
    union = nx.from_numpy_array(((T != 0) | (E != 0)).astype(int), create_using=nx.DiGraph)
    pos = nx.circular_layout(union) if M > 30 else nx.kamada_kawai_layout(union.to_undirected()) \
        if union.number_of_edges() else nx.circular_layout(union)
    fig, axes = plt.subplots(2, 2, figsize=(10, 9.5))
    vmax = max(np.abs(T).max(), np.abs(E).max(), 1e-12)
    true_edges = {(int(i), int(j)) for i, j in zip(*np.nonzero(T), strict=True)}
    for col, (A, title) in enumerate(zip((T, E), titles, strict=True)):
        graph = nx.from_numpy_array((A != 0).astype(int), create_using=nx.DiGraph)
        ax = axes[0, col]
        if col == 0:
            colors = ["black"] * graph.number_of_edges()
        else:  # green: true edge, orange: reversed true edge, red: false positive
            colors = ["tab:green" if e in true_edges else "tab:orange" if (e[1], e[0]) in true_edges else "tab:red"
                      for e in graph.edges()]
        nx.draw_networkx(graph, pos, ax=ax, labels=dict(enumerate(labels)), node_color="#cfe2f3",
                         edge_color=colors, arrowsize=12, node_size=350 if M <= 30 else 60,
                         with_labels=M <= 30, font_size=8)
        ax.set_title(f"{title} ({graph.number_of_edges()} edges)")
        ax.axis("off")
        im = axes[1, col].imshow(A, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        axes[1, col].set_title(f"{title} adjacency (row → column)")
        if M <= 30:
            axes[1, col].set_xticks(range(M), labels, rotation=90, fontsize=7)
            axes[1, col].set_yticks(range(M), labels, fontsize=7)
    fig.colorbar(im, ax=axes[1, :].tolist(), shrink=0.8, label="edge weight")
    return finish(fig, save=save, show=show, return_fig=return_fig, owned=True)
