"""``cape.pl.dag``: the learnt gene DAG around its most general genes, drawn so that it stays readable."""

from __future__ import annotations

import os

import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
import scipy.sparse as sp
from matplotlib.lines import Line2D

from .._errors import CapeInputError
from ..causal import SOLID_CONFIDENCE
from ._figure import checked_save_path, finish
from ._labels import place_labels

__all__ = ["dag"]

#: gid of the genes' markers (one PathCollection), so that tests can count the genes drawn.
NODES_GID = "cape_dag_genes"


def dag(adata, *, key: str = "cape_dag", n_genes: int = 40, order_by: str = "cape_generality", n_labels: int = 20,
        seed: int = 0, ax=None, show: bool | None = None, return_fig: bool = False, title: str | None = None,
        save: str | os.PathLike | None = None):
    """Draw ``varp[key]`` on at most ``n_genes`` genes: the most general genes that have an edge, each with its
    heaviest partners, so that every gene drawn has an edge.

    Edge width is ``|weight|``, colour its sign; with ``varp[key + "_confidence"]`` (Step I's edge confidence), an
    edge below :data:`~cape.causal.SOLID_CONFIDENCE` is dashed: a guess, whose dependence the child's other parents
    and the cells' state explain, or whose gene pair Step I's edge budget did not count. Each connected module is laid
    out on its own (Kamada–Kawai) and the modules are packed in rows, largest first; the ``n_labels`` most general
    genes drawn are named, without overlapping labels. Genes without any edge are left out, and a note under the graph
    counts them.

    Parameters
    ----------
    adata
        AnnData with ``varp[key]`` (from :func:`cape.tl.causal_graph`).
    n_genes
        At most this many genes drawn.
    order_by
        ``var`` column ranking the genes (default: PageRank generality; degree when the column is absent).
    n_labels
        How many of the genes drawn to name (highest ``order_by`` first); a label with no free spot is left out.
    seed
        Seed of the layout's starting positions.
    ax, show, return_fig, title
        scanpy conventions.
    save
        A file to write the figure to, its format from the suffix (``dag.png``); the figure is then not shown
        unless ``show=True``.

    Reads
    -----
    ``varp["cape_dag"]`` (``key``), ``varp["cape_dag_confidence"]`` when present, ``var["cape_generality"]``
    (``order_by``) and ``var["cape_used"]`` (which genes the note counts).
    """
    save, owned = checked_save_path(save), ax is None

    if key not in adata.varp:
        raise CapeInputError(f"varp[{key!r}] not found: run cape.tl.causal_graph (`cape causal`) first")
    if n_genes < 2:
        raise CapeInputError(f"n_genes must be at least 2 (an edge has two genes), got {n_genes}")
    A = adata.varp[key]
    A = A.tocsr() if sp.issparse(A) else sp.csr_matrix(np.asarray(A))
    A.eliminate_zeros()
    degree = np.diff(A.indptr) + np.bincount(A.indices, minlength=A.shape[0])
    if not degree.any():
        raise CapeInputError(f"varp[{key!r}] has no edges to draw")
    score = adata.var[order_by].to_numpy(float) if order_by in adata.var else degree.astype(float)
    keep = _select_genes(A, degree, score, n_genes)
    sub = A[keep][:, keep].toarray()
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(keep)))
    solid = _solid_edges(adata, key, keep)
    for i, j in zip(*np.nonzero(sub), strict=True):
        graph.add_edge(int(i), int(j), weight=float(sub[i, j]), solid=bool(solid is None or solid[i, j]))
    pos = _layout(graph, seed)

    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 7.5))
    fig = fig or ax.figure
    weights = np.array([abs(d["weight"]) for *_, d in graph.edges(data=True)])
    widths = 0.4 + 3.0 * weights / max(float(weights.max()), 1e-12)
    colours = ["tab:red" if d["weight"] < 0 else "tab:blue" for *_, d in graph.edges(data=True)]
    labelled = np.argsort(-score[keep], kind="stable")[:max(n_labels, 0)]
    node_colour = np.where(np.isin(np.arange(len(keep)), labelled), "#f6b26b", "#cfe2f3")
    nodes = nx.draw_networkx_nodes(graph, pos, ax=ax, node_color=list(node_colour), node_size=90,
                                   edgecolors="0.3", linewidths=0.5)
    nodes.set_gid(NODES_GID)
    for style in ("solid", "dashed"):
        chosen = [k for k, (*_, d) in enumerate(graph.edges(data=True)) if d["solid"] == (style == "solid")]
        if chosen:
            nx.draw_networkx_edges(graph, pos, ax=ax, edgelist=[list(graph.edges)[k] for k in chosen],
                                   width=list(widths[chosen]), edge_color=[colours[k] for k in chosen],
                                   style=style, arrowsize=8, node_size=90, alpha=0.8)
    xy = np.array([pos[n] for n in range(len(keep))])
    pad = 0.12 * float(np.ptp(xy, axis=0).max() or 1.0)
    ax.set_xlim(xy[:, 0].min() - pad, xy[:, 0].max() + pad)
    ax.set_ylim(xy[:, 1].min() - pad, xy[:, 1].max() + pad)
    ax.axis("off")
    used = adata.var["cape_used"].to_numpy(bool) if "cape_used" in adata.var else np.ones(adata.n_vars, bool)
    n_isolated = int(np.sum(used & (degree == 0)))
    ax.set_title(title or f"causal gene graph: {len(keep)} genes around the most general, "
                 f"{graph.number_of_edges()} of {A.nnz} edges", fontsize=10)
    ax.text(0.0, -0.01, f"{n_isolated} of {int(used.sum())} genes have no edge (not drawn); "
            f"{int(np.sum(degree > 0)) - len(keep)} more genes with an edge are not shown. "
            f"Orange: the {len(labelled)} most general genes drawn ({order_by if order_by in adata.var else 'degree'})."
            " Arrows point from cause to effect.", transform=ax.transAxes, fontsize=7, va="top", wrap=True)
    handles = [Line2D([], [], color="tab:blue", label="positive weight"),
               Line2D([], [], color="tab:red", label="negative weight")]
    if solid is not None:
        handles.append(Line2D([], [], color="0.4", linestyle="--", label=f"confidence < {SOLID_CONFIDENCE:g}"))
    ax.legend(handles=handles,
              loc="lower right", fontsize=7, frameon=False, title="edge width: |weight|", title_fontsize=7)
    centre = xy.mean(axis=0)
    place_labels(ax, xy[labelled], [str(adata.var_names[keep[i]]) for i in labelled],
                 outward=xy[labelled] - centre, obstacles=xy, marker_pt=5.0)
    return finish(fig, save=save, show=show, return_fig=return_fig, owned=owned)


def _solid_edges(adata, key: str, keep: np.ndarray) -> np.ndarray | None:
    """Boolean matrix over ``keep``: the edge's confidence reaches :data:`SOLID_CONFIDENCE` (``None``: no
    confidence stored)."""
    if f"{key}_confidence" not in adata.varp:
        return None
    confidence = adata.varp[f"{key}_confidence"]
    confidence = confidence.tocsr() if sp.issparse(confidence) else sp.csr_matrix(np.asarray(confidence))
    return confidence[keep][:, keep].toarray() >= SOLID_CONFIDENCE


def _select_genes(A: sp.csr_matrix, degree: np.ndarray, score: np.ndarray, n_genes: int) -> np.ndarray:
    """Indices of at most ``n_genes`` genes, each with an edge among them.

    Genes with an edge are taken by falling ``score``; each brings its heaviest partners (up to ``n_genes // 5``
    not yet chosen) so that a hub is drawn with its targets and no gene drawn is alone.
    """

    undirected = (abs(A) + abs(A).T).tocsr()
    per_gene = max(1, n_genes // 5)
    chosen: dict[int, None] = {}  # insertion-ordered set
    for g in np.flatnonzero(degree > 0)[np.argsort(-score[degree > 0], kind="stable")]:
        if len(chosen) >= n_genes:
            break
        row = undirected.getrow(g)
        partners = row.indices[np.argsort(-row.data, kind="stable")]
        if g in chosen:
            new = [int(p) for p in partners if p not in chosen][:min(per_gene, n_genes - len(chosen))]
        else:
            has_partner = any(p in chosen for p in partners)
            room = n_genes - len(chosen) - 1
            new = [int(p) for p in partners if p not in chosen][:min(per_gene, room)]
            if not (has_partner or new):
                continue
            chosen[int(g)] = None
        chosen.update(dict.fromkeys(new))
    return np.fromiter(chosen, dtype=int)


def _layout(graph: nx.DiGraph, seed: int) -> dict[int, np.ndarray]:
    """Each weakly connected module laid out alone, then the modules packed in rows, largest first.

    One layout of the whole graph would push the modules apart onto a circle with long crossing edges; apart,
    each module keeps its hub in the middle of its targets.
    """

    modules = sorted(nx.weakly_connected_components(graph), key=lambda m: (-len(m), min(m)))
    rng = np.random.default_rng(seed)
    boxes = []
    for module in modules:
        sub = graph.subgraph(module).to_undirected()
        start = {n: rng.uniform(-1, 1, 2) for n in sorted(module)}
        local = nx.kamada_kawai_layout(sub, pos=start, weight=None) if len(module) > 2 else {
            n: np.array([2.0 * k - 1.0, 0.0]) for k, n in enumerate(sorted(module))}
        xy = np.array([local[n] for n in sorted(module)], dtype=float)
        xy -= xy.mean(axis=0)
        # a module's size grows like the square root of its genes, so that gene spacing stays alike
        span = float(np.abs(xy).max()) or 1.0
        boxes.append((sorted(module), xy * (0.5 * np.sqrt(len(module)) / span)))
    width = max(2.0 * np.sqrt(graph.number_of_nodes()), 2 * max(np.abs(xy).max() for _, xy in boxes) + 1.0)
    pos: dict[int, np.ndarray] = {}
    x = y = row_height = 0.0
    for nodes, xy in boxes:
        half = np.abs(xy).max(axis=0) + 0.5  # margin between modules
        if x + 2 * half[0] > width and x > 0:
            x, y, row_height = 0.0, y - row_height, 0.0
        centre = np.array([x + half[0], y - half[1]])
        for n, p in zip(nodes, xy, strict=True):
            pos[n] = centre + p
        x += 2 * half[0]
        row_height = max(row_height, 2 * half[1])
    return pos
