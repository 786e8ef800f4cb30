"""Embedding fidelity of Step II: does the embedding keep the DAG's causal neighbourhoods and generality?

- **MAP** (graph-reconstruction mean average precision): for every node, rank all other nodes by embedding
  distance and take the average precision of its k-hop directed-path neighbours (ancestors or descendants
  within k edges, the positives of Eq. 16); average over nodes that have any.
- **Spearman(π, −‖e‖)**: general nodes (high PageRank π) should sit near the origin of the Poincaré ball.
- **Oracle MAP**: the same MAP when nodes are ranked by the true *undirected* graph distance (ties broken
  at random, see below). It is below 1 because siblings and co-parents
  sit at graph distance 2 without being causal neighbours. Graph distances tie a lot; ties are broken at
  random and the MAP averaged over ``tie_draws`` seeded draws (the expected MAP of a random tie order,
  ≈ 0.76 on 100-node BA DAGs); ``oracle_map_pessimistic`` scores a tie group at its end, as scikit-learn
  does (≈ 0.67).

``cape bench embedding`` compares hyperbolic against Euclidean embeddings at several dimensions.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.stats import spearmanr
from sklearn.metrics import average_precision_score

logger = logging.getLogger("cape")


def barabasi_albert_dag(n_nodes: int = 100, edges_per_node: int = 2, *, seed: int = 0,
                        weight_range: tuple[float, float] = (0.5, 2.0)) -> sp.csr_matrix:
    """Scale-free DAG: a Barabási–Albert graph with every edge oriented old → new (i → j for i < j), edge
    strengths uniform in ``weight_range`` with a random sign (gcastle's convention)."""
    graph = nx.barabasi_albert_graph(n_nodes, edges_per_node, seed=seed)
    rng = np.random.default_rng(seed)
    edges = np.array(sorted((min(u, v), max(u, v)) for u, v in graph.edges()), dtype=np.int64)
    weights = rng.uniform(*weight_range, size=len(edges)) * rng.choice([-1.0, 1.0], size=len(edges))
    return sp.csr_matrix((weights, (edges[:, 0], edges[:, 1])), shape=(n_nodes, n_nodes))


def khop_relevance(adjacency: sp.spmatrix, k: int = 2) -> sp.csr_matrix:
    """Boolean symmetric M×M matrix: a directed path of at most k edges joins the two nodes."""
    step = sp.csr_matrix((abs(adjacency) > 0).astype(np.float64))
    reach = step.copy()
    power = step.copy()
    for _ in range(1, int(k)):
        power = sp.csr_matrix(power @ step)
        reach = reach + power
    reach = ((reach + reach.T) > 0).tocsr()
    reach.setdiag(False)
    reach.eliminate_zeros()
    return reach


def mean_average_precision(distances: np.ndarray, relevant: sp.spmatrix) -> float:
    """Mean over nodes (with ≥ 1 relevant node) of the average precision of ranking the other nodes by
    increasing ``distances[m]``."""
    relevant = sp.csr_matrix(relevant)
    n = distances.shape[0]
    scores = []
    for m in range(n):
        row = relevant[m].toarray().ravel().astype(bool)
        row[m] = False
        if not row.any():
            continue
        others = np.arange(n) != m
        scores.append(average_precision_score(row[others], -distances[m, others]))
    return float(np.mean(scores)) if scores else float("nan")


def undirected_graph_distances(adjacency: sp.spmatrix) -> np.ndarray:
    """All-pairs shortest-path lengths of the undirected skeleton (unreachable = n_nodes, beyond any path)."""
    skeleton = sp.csr_matrix((abs(adjacency) > 0).astype(np.float64))
    dist = sp.csgraph.shortest_path(skeleton, directed=False, unweighted=True)
    dist[~np.isfinite(dist)] = adjacency.shape[0]
    return dist


def oracle_map(adjacency: sp.spmatrix, k: int = 2, *, tie_draws: int = 20, seed: int = 0) -> dict:
    """MAP of ranking by the true undirected graph distance: expected over random tie orders, and
    pessimistic (a tie group scored at its end)."""
    dist = undirected_graph_distances(adjacency)
    relevant = khop_relevance(adjacency, k)
    rng = np.random.default_rng(seed)
    draws = [mean_average_precision(dist + rng.uniform(0.0, 0.5, dist.shape), relevant)
             for _ in range(tie_draws)]
    return {"oracle_map": float(np.mean(draws)),
            "oracle_map_pessimistic": mean_average_precision(dist, relevant)}


def embedding_fidelity(points: np.ndarray, poincare: np.ndarray, adjacency: sp.spmatrix,
                       generality: np.ndarray, *, geometry: str = "hyperbolic", k: int = 2,
                       with_oracle: bool = True, tie_draws: int = 20) -> dict:
    """MAP over k-hop directed-path neighbours, the oracle MAP, and Spearman(π, −‖e‖).

    Parameters
    ----------
    points
        Hyperboloid points (M, d+1) for ``geometry="hyperbolic"``, Euclidean points (M, d) otherwise.
    poincare
        (M, d) ball positions (their norms measure specificity).
    adjacency
        The true M×M weighted DAG.
    generality
        PageRank π (M,).

    Returns
    -------
    dict
        ``map``, ``spearman`` and (``with_oracle``) ``oracle_map``, ``oracle_map_pessimistic``.
    """
    import torch

    from ..hyperbolic.geometry import GEOMETRIES

    x = torch.as_tensor(points, dtype=torch.float64)
    dist = GEOMETRIES[geometry].dist_matrix(x, x).numpy()
    relevant = khop_relevance(adjacency, k)
    rho = spearmanr(generality, -np.linalg.norm(poincare, axis=1)).statistic
    out = {"map": mean_average_precision(dist, relevant), "spearman": float(rho)}
    if with_oracle:
        out.update(oracle_map(adjacency, k, tie_draws=tie_draws))
    return out


def _fidelity_records(dims, seeds, epochs: int, n_nodes: int) -> list[dict]:
    from ..hyperbolic import embed_dag

    records: list[dict] = []
    for seed in seeds:
        adjacency = barabasi_albert_dag(n_nodes, 2, seed=seed)
        oracle = oracle_map(adjacency, 2)
        for metric in ("oracle_map", "oracle_map_pessimistic"):
            records.append({"section": "fidelity", "geometry": "oracle (graph distance)", "dim": "-",
                            "seed": seed, "metric": "map" if metric == "oracle_map" else "map (ties last)",
                            "value": oracle[metric]})
        for dim in dims:
            for geometry in ("hyperbolic", "euclidean"):
                result = embed_dag(adjacency, dim=dim, epochs=epochs, geometry=geometry, seed=seed,
                                   negatives=None, show_progress=False)
                fid = embedding_fidelity(result.points, result.poincare, adjacency, result.generality,
                                         geometry=geometry, with_oracle=False)
                for metric in ("map", "spearman"):
                    records.append({"section": "fidelity", "geometry": geometry, "dim": dim, "seed": seed,
                                    "metric": metric, "value": fid[metric]})
                records.append({"section": "fidelity", "geometry": geometry, "dim": dim, "seed": seed,
                                "metric": "seconds", "value": result.seconds})
                logger.info("embedding bench: seed %d dim %d %s MAP %.3f Spearman %.3f (oracle %.3f)", seed,
                            dim, geometry, fid["map"], fid["spearman"], oracle["oracle_map"])
    return records


def _scaling_records(quick: bool, seed: int = 0) -> list[dict]:
    """Sampled against exact loss where both run, and the time of a 2,000-gene, d = 32 embedding."""
    import torch

    from ..hyperbolic import embed_dag
    from ..hyperbolic.embedding import DEFAULT_NEGATIVES

    records: list[dict] = []
    n_compare, n_large, epochs = (200, 400, 100) if quick else (500, 2000, 1000)
    adjacency = barabasi_albert_dag(n_compare, 2, seed=seed)
    for negatives in (None, DEFAULT_NEGATIVES):
        result = embed_dag(adjacency, dim=32, epochs=epochs, negatives=negatives, seed=seed,
                           show_progress=False)
        fid = embedding_fidelity(result.points, result.poincare, adjacency, result.generality,
                                 with_oracle=False)
        loss = "exact" if negatives is None else f"sampled K={negatives}"
        for metric in ("map", "spearman"):
            records.append({"section": "scaling", "n_genes": n_compare, "loss": loss, "metric": metric,
                            "value": fid[metric]})
        records.append({"section": "scaling", "n_genes": n_compare, "loss": loss, "metric": "seconds",
                        "value": result.seconds})
        records.append({"section": "scaling", "n_genes": n_compare, "loss": loss, "metric": "cpu_seconds",
                        "value": result.cpu_seconds})
        logger.info("embedding bench: %d genes, %s: MAP %.3f, %.1f s wall, %.1f s CPU", n_compare, loss,
                    fid["map"], result.seconds, result.cpu_seconds)
    adjacency = barabasi_albert_dag(n_large, 2, seed=seed)
    result = embed_dag(adjacency, dim=32, epochs=epochs, negatives=DEFAULT_NEGATIVES, seed=seed,
                       show_progress=False)
    fid = embedding_fidelity(result.points, result.poincare, adjacency, result.generality, with_oracle=False)
    loss = f"sampled K={DEFAULT_NEGATIVES}"
    for metric in ("map", "spearman"):
        records.append({"section": "scaling", "n_genes": n_large, "loss": loss, "metric": metric,
                        "value": fid[metric]})
    records.append({"section": "scaling", "n_genes": n_large, "loss": loss, "metric": "seconds",
                    "value": result.seconds})
    records.append({"section": "scaling", "n_genes": n_large, "loss": loss, "metric": "cpu_seconds",
                    "value": result.cpu_seconds})
    records.append({"section": "scaling", "n_genes": n_large, "loss": loss, "metric": "torch_threads",
                    "value": torch.get_num_threads()})
    logger.info("embedding bench: %d genes, d=32, %d epochs, K=%d negatives: %.1f s wall, %.1f s CPU, MAP %.3f",
                n_large, epochs, DEFAULT_NEGATIVES, result.seconds, result.cpu_seconds, fid["map"])
    return records


def run_benchmark(out: str | Path = "results/bench", *, quick: bool = False, dims=(2, 4, 8, 16, 32),
                  seeds=(0, 1, 2), epochs: int = 1000, sections=("fidelity", "scaling"),
                  n_nodes: int = 100) -> list[dict]:
    """``cape bench embedding``.

    ``"fidelity"``: MAP / Spearman of hyperbolic vs Euclidean embeddings of ``n_nodes``-node BA DAGs at several
    dimensions, with the graph-distance oracle → ``embedding.json``, ``embedding.md``, ``embedding.png``.
    ``"scaling"``: sampled vs exact loss at 500 genes, and the time of a 2,000-gene, d = 32, 1,000-epoch
    embedding → ``embedding_scaling.json``, ``embedding_scaling.md``.
    """
    from .report import mean_sd_table, write_json, write_text

    if quick:
        dims, seeds, epochs, n_nodes = (2, 8), (0,), min(epochs, 150), 40
    out = Path(out)
    records: list[dict] = []
    if "fidelity" in sections:
        start = time.perf_counter()
        fidelity = _fidelity_records(list(dims), list(seeds), epochs, n_nodes)
        records += fidelity
        write_json(fidelity, out / "embedding.json")
        lines = [f"# Step II embedding fidelity ({n_nodes}-node Barabási–Albert DAGs, 2 edges per node, "
                 f"old → new; {epochs} epochs, exact loss, RSGD; seeds {list(seeds)})", "",
                 "MAP over each node's 2-hop directed-path neighbours (ranking all nodes by embedding distance), "
                 "Spearman(π, −‖e‖). Oracle: ranking by the true undirected graph distance (ties random / last).",
                 "", mean_sd_table(fidelity, rows=["geometry", "dim"], columns=["metric"]), "",
                 f"Total {time.perf_counter() - start:.0f} s on this machine."]
        write_text("\n".join(lines) + "\n", out / "embedding.md")
        _plot(fidelity, out / "embedding.png")
    if "scaling" in sections:
        start = time.perf_counter()
        scaling = _scaling_records(quick)
        records += scaling
        write_json(scaling, out / "embedding_scaling.json")
        lines = ["# Step II: sampled vs exact loss, and scale (d = 32, BA DAGs)", "",
                 "seconds = wall clock; cpu_seconds = CPU time of the process over all its threads (the cost on "
                 "an otherwise idle machine; wall is inflated when the machine is shared).", "",
                 mean_sd_table(scaling, rows=["n_genes", "loss"], columns=["metric"]), "",
                 f"Total {time.perf_counter() - start:.0f} s on this machine."]
        write_text("\n".join(lines) + "\n", out / "embedding_scaling.md")
    return records


def _plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from .report import save_figure

    frame = pd.DataFrame(records)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, metric, label in ((axes[0], "map", "MAP (2-hop directed neighbours)"),
                              (axes[1], "spearman", "Spearman(π, −‖e‖)")):
        for geometry, colour in (("hyperbolic", "C0"), ("euclidean", "C1")):
            sub = frame[(frame.geometry == geometry) & (frame.metric == metric)]
            stats = sub.groupby("dim")["value"].agg(["mean", "std"]).reset_index().sort_values("dim")
            ax.errorbar(stats["dim"], stats["mean"], yerr=stats["std"].fillna(0), marker="o", capsize=3,
                        color=colour, label=geometry)
        if metric == "map":
            oracle = frame[(frame.geometry == "oracle (graph distance)") & (frame.metric == "map")]["value"]
            ax.axhline(oracle.mean(), color="grey", ls="--", label="oracle (graph distance)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("dimension d")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
