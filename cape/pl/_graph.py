"""``cape.pl.dag``: the learnt gene DAG, restricted to its most general genes so that it stays readable."""

from __future__ import annotations

import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
import scipy.sparse as sp
from matplotlib.lines import Line2D

from .._errors import CapeInputError

__all__ = ["dag"]


def dag(adata, *, key: str = "cape_dag", n_genes: int = 40, order_by: str = "cape_generality", ax=None,
        show: bool | None = None, return_fig: bool = False, title: str | None = None):
    """Draw ``varp[key]`` on its ``n_genes`` genes of highest ``var[order_by]`` (or highest degree), in layers
    by topological generation (causes on top), edge width by ``|weight|``, red for negative weights.

    Parameters
    ----------
    adata
        AnnData with ``varp[key]`` (from :func:`cape.tl.causal_graph`).
    n_genes
        How many genes to show.
    order_by
        ``var`` column ranking the genes (default: PageRank generality; degree when the column is absent).
    ax, show, return_fig, title
        scanpy conventions.

    Reads
    -----
    ``varp["cape_dag"]`` (``key``) and ``var["cape_generality"]`` (``order_by``).
    """

    if key not in adata.varp:
        raise CapeInputError(f"varp[{key!r}] not found: run cape.tl.causal_graph (`cape causal`) first")
    A = adata.varp[key]
    A = A.tocsr() if sp.issparse(A) else sp.csr_matrix(np.asarray(A))
    degree = np.asarray((A != 0).sum(0)).ravel() + np.asarray((A != 0).sum(1)).ravel()
    score = adata.var[order_by].to_numpy(float) if order_by in adata.var else degree.astype(float)
    candidates = np.flatnonzero(degree > 0)
    if candidates.size == 0:
        raise CapeInputError(f"varp[{key!r}] has no edges to draw")
    keep = candidates[np.argsort(-score[candidates], kind="stable")[:n_genes]]
    sub = A[keep][:, keep].toarray()
    names = list(adata.var_names[keep])
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(keep)))
    for i, j in zip(*np.nonzero(sub), strict=True):
        graph.add_edge(int(i), int(j), weight=float(sub[i, j]))
    for layer, nodes in enumerate(nx.topological_generations(graph)):
        for n in nodes:
            graph.nodes[n]["layer"] = layer
    pos = nx.multipartite_layout(graph, subset_key="layer", align="horizontal")
    pos = {n: (x, -y) for n, (x, y) in pos.items()}  # causes on top
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 7))
    weights = np.array([abs(d["weight"]) for *_, d in graph.edges(data=True)]) if graph.number_of_edges() else []
    widths = 0.5 + 2.5 * np.asarray(weights) / max(float(np.max(weights)), 1e-12) if len(weights) else []
    colours = ["tab:red" if d["weight"] < 0 else "tab:blue" for *_, d in graph.edges(data=True)]
    nx.draw_networkx(graph, pos, ax=ax, labels=dict(enumerate(names)), node_color="#cfe2f3", node_size=300,
                     font_size=7, width=widths, edge_color=colours, arrowsize=10)
    ax.set_title(title or f"causal gene graph: {len(keep)} most general genes, {graph.number_of_edges()} edges "
                 f"(of {A.nnz} in all)")
    if graph.number_of_edges():
        ax.legend(handles=[Line2D([], [], color="tab:blue", label="positive weight"),
                           Line2D([], [], color="tab:red", label="negative weight")],
                  loc="lower right", fontsize=7, frameon=False, title="edge width: |weight|", title_fontsize=7)
    ax.axis("off")
    fig = fig or ax.figure
    if return_fig:
        return fig
    if show or show is None:
        plt.show()
    return None
