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

``cape-bench embedding`` compares hyperbolic against Euclidean embeddings at several dimensions; its ``hierarchy``
section measures Spearman(π, −‖e‖) on graphs shaped like those Step I finds on users' data (:func:`sparse_hub_dag`:
a few hubs, scattered edges, most genes without an edge) under Step II's default and a few changed options.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch
from scipy.stats import spearmanr
from sklearn.metrics import average_precision_score

from cape import data, pp, tl
from cape._io import save_figure, write_json, write_text
from cape._tables import mean_sd_table
from cape.hyperbolic import embed_dag
from cape.hyperbolic.embedding import DEFAULT_LR, DEFAULT_NEGATIVES, DEFAULT_TEMPERATURE
from cape.hyperbolic.geometry import GEOMETRIES
from cape.hyperbolic.hierarchy import hierarchy_spearman

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

    x = torch.as_tensor(points, dtype=torch.float64)
    dist = GEOMETRIES[geometry].dist_matrix(x, x).numpy()
    relevant = khop_relevance(adjacency, k)
    rho = spearmanr(generality, -np.linalg.norm(poincare, axis=1)).statistic
    out = {"map": mean_average_precision(dist, relevant), "spearman": float(rho)}
    if with_oracle:
        out.update(oracle_map(adjacency, k, tie_draws=tie_draws))
    return out


def sparse_hub_dag(n_genes: int = 300, *, seed: int = 0, hubs: tuple[int, ...] = (10, 5, 5), n_edges: int = 55,
                   n_pool: int = 60) -> sp.csr_matrix:
    """A DAG shaped like Step I's graphs on users' data: hubs driving ``hubs`` children each (weights 0.3–1, random
    sign), then scattered edges (weights 0.2–0.6) among ``n_pool`` further genes up to ``n_edges`` edges in all;
    every other gene has no edge. Genes are placed in a random order; scattered edges point from the lower to the
    higher index, so the graph is acyclic."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(n_genes)
    edges: dict[tuple[int, int], float] = {}
    start = 0
    for n_children in hubs:
        hub, children = order[start], order[start + 1:start + 1 + n_children]
        start += 1 + n_children
        for child in children:
            edges[int(hub), int(child)] = rng.uniform(0.3, 1.0) * rng.choice([-1, 1])
    pool = order[start:start + n_pool]
    while len(edges) < n_edges:
        a, b = rng.choice(pool, 2, replace=False)
        edges[int(min(a, b)), int(max(a, b))] = rng.uniform(0.2, 0.6)
    rows, cols = np.array(list(edges)).T
    return sp.csr_matrix((list(edges.values()), (rows, cols)), shape=(n_genes, n_genes))


#: Step II variants of the hierarchy section: the default, one option changed at a time (``lambda_g`` given as a
#: multiple of M, which puts λ_g·π on the scale of a mean-1 generality), and per-anchor weights with that λ_g.
HIERARCHY_VARIANTS = {"default": {}, "isolated=origin": {"isolated": "origin"}, "temperature=1": {"temperature": 1.0},
                      "lambda_g=0.1·M": {"lambda_g_per_gene": 0.1},
                      "positive_weights=per_anchor": {"positive_weights": "per_anchor"},
                      "per_anchor, lambda_g=0.1·M": {"positive_weights": "per_anchor", "lambda_g_per_gene": 0.1}}


#: Variants run on the larger graphs and on pbmc68k_reduced's DAG.
_LARGE_VARIANTS = {name: HIERARCHY_VARIANTS[name] for name in ("default", "positive_weights=per_anchor")}


def hierarchy_metrics(result, nodes: np.ndarray | None = None) -> dict:
    """Spearman(π, −‖e‖) over the embedded genes and over those with an edge, and where the most general gene
    sits: the share of the genes with an edge that lie nearer the origin than it (0: the most central)."""
    embedded = result.embedded if nodes is None else result.embedded & nodes
    connected = result.connected & embedded
    norms = np.linalg.norm(result.poincare, axis=1)
    hub = int(np.argmax(np.where(connected, result.generality, -np.inf)))
    return {"spearman_all": hierarchy_spearman(result.generality, result.poincare, embedded).spearman,
            "spearman_with_edge": hierarchy_spearman(result.generality, result.poincare, connected).spearman,
            "n_with_edge": int(connected.sum()),
            "hub_rank": float((norms[connected] < norms[hub]).mean()),
            "hub_norm": float(norms[hub]), "median_norm_with_edge": float(np.median(norms[connected]))}


def _hierarchy_records(graphs: dict, seeds, epochs: int, variants=HIERARCHY_VARIANTS, out: Path | None = None
                       ) -> list[dict]:
    """One record per graph, Step II variant, seed and metric of :func:`hierarchy_metrics`. ``graphs`` maps a name
    to ``(adjacency_for_seed, nodes)``: a function of the seed giving the DAG, and the mask of genes that may take
    part (``None``: all)."""
    records: list[dict] = []
    for graph, (make, nodes) in graphs.items():
        for variant, options in variants.items():
            for seed in seeds:
                adjacency = make(seed)
                options = dict(options)
                if "lambda_g_per_gene" in options:
                    options["lambda_g"] = options.pop("lambda_g_per_gene") * adjacency.shape[0]
                result = embed_dag(adjacency, epochs=epochs, seed=seed, nodes=nodes, show_progress=False,
                                   **options)
                for metric, value in hierarchy_metrics(result, nodes).items():
                    records.append({"section": "hierarchy", "graph": graph, "variant": variant, "seed": seed,
                                    "metric": metric, "value": value})
                logger.info("embedding bench: %s, %s, seed %d: Spearman %.2f (with an edge), hub rank %.2f", graph,
                            variant, seed, records[-5]["value"], records[-3]["value"])
                if out is not None:
                    write_json(records, out / "embedding_hierarchy.json")
    return records


def _pbmc_graph() -> tuple[sp.csr_matrix, np.ndarray]:
    """The DAG of the default pbmc68k_reduced run (300 genes, Step I's defaults, seed 0) and its used genes."""
    adata = data.load("pbmc68k_reduced")
    pp.preprocess(adata, n_top_genes=300)
    tl.causal_graph(adata)
    return sp.csr_matrix(adata.varp["cape_dag"]), adata.var["cape_used"].to_numpy(dtype=bool)


def _fidelity_records(dims, seeds, epochs: int, n_nodes: int) -> list[dict]:
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


def _scaling_records(quick: bool, out: Path, seed: int = 0) -> list[dict]:
    """Time against M for the exact and the sampled loss, MAP of both where both run, and the full
    2,000-gene, d = 32, 1,000-epoch embedding. Records are written to ``out`` after every run, so an
    interrupted benchmark still leaves what it measured."""

    # K = DEFAULT_NEGATIVES ≥ M would be the exact loss, so the fidelity comparison at a size where the exact
    # loss also runs samples fewer negatives (K = 256 of M = 300): a stress test of sampling.
    k_time = 64 if quick else DEFAULT_NEGATIVES
    k_compare = 32 if quick else 256
    if quick:
        sizes_exact, sizes_sampled, timing_epochs, n_compare, n_large, epochs = \
            (50, 100), (50, 100, 300), 20, 100, 300, 100
    else:
        sizes_exact, sizes_sampled, timing_epochs, n_compare, n_large, epochs = \
            (100, 200, 500, 1000), (100, 200, 500, 1000, 2000, 5000), 100, 300, 2000, 1000
    compare_seeds = (seed,) if quick else (seed, seed + 1, seed + 2)
    records: list[dict] = []
    threads = torch.get_num_threads()

    def add(part: str, n: int, loss: str, metric: str, value) -> None:
        records.append({"section": "scaling", "part": part, "n_genes": n, "loss": loss, "metric": metric,
                        "value": value})

    # 1. Time per epoch against M (short runs; the cost per epoch does not depend on the epoch). A first
    # small run pays the one-off costs (imports, geoopt's TorchScript compilation) outside the timings.
    embed_dag(barabasi_albert_dag(20, 2, seed=seed), dim=4, epochs=2, negatives=8, seed=seed, show_progress=False)
    for loss, sizes, negatives in (("exact", sizes_exact, None), (f"sampled K={k_time}", sizes_sampled, k_time)):
        for n in sizes:
            adjacency = barabasi_albert_dag(n, 2, seed=seed)
            result = embed_dag(adjacency, dim=32, epochs=timing_epochs, negatives=negatives, seed=seed,
                               show_progress=False)
            add("time vs M", n, loss, "seconds per 1000 epochs", result.seconds * 1000 / timing_epochs)
            add("time vs M", n, loss, "cpu seconds per 1000 epochs", result.cpu_seconds * 1000 / timing_epochs)
            logger.info("embedding bench: %d genes, %s: %.1f s per 1000 epochs (%d-epoch run)", n, loss,
                        result.seconds * 1000 / timing_epochs, timing_epochs)
            write_json(records, out / "embedding_scaling.json")
    # 2. What sampling costs in fidelity: exact against sampled on the same graphs, full epochs, several
    # seeds (one seed's optimum varies by a few MAP points at this size, with either loss).
    for graph_seed in compare_seeds:
        adjacency = barabasi_albert_dag(n_compare, 2, seed=graph_seed)
        oracle = oracle_map(adjacency, 2, tie_draws=5)["oracle_map"]
        add("exact vs sampled", n_compare, "oracle (graph distance)", "map", oracle)
        for loss, negatives in (("exact", None), (f"sampled K={k_compare}", k_compare)):
            result = embed_dag(adjacency, dim=32, epochs=epochs, negatives=negatives, seed=graph_seed,
                               show_progress=False)
            fid = embedding_fidelity(result.points, result.poincare, adjacency, result.generality,
                                     with_oracle=False)
            for metric in ("map", "spearman"):
                add("exact vs sampled", n_compare, loss, metric, fid[metric])
            add("exact vs sampled", n_compare, loss, "seconds", result.seconds)
            logger.info("embedding bench: %d genes, seed %d, %s: MAP %.3f (oracle %.3f), %.1f s", n_compare,
                        graph_seed, loss, fid["map"], oracle, result.seconds)
            write_json(records, out / "embedding_scaling.json")
    # 3. The large run, in full, with K = 256 and with the default K (no exact run fits here).
    part = f"{n_large} genes, {epochs} epochs"
    adjacency = barabasi_albert_dag(n_large, 2, seed=seed)
    add(part, n_large, "oracle (graph distance)", "map", oracle_map(adjacency, 2, tie_draws=2)["oracle_map"])
    for negatives in (k_compare, DEFAULT_NEGATIVES):
        loss = f"sampled K={negatives}"
        result = embed_dag(adjacency, dim=32, epochs=epochs, negatives=negatives, seed=seed, show_progress=False)
        fid = embedding_fidelity(result.points, result.poincare, adjacency, result.generality, with_oracle=False)
        for metric in ("map", "spearman"):
            add(part, n_large, loss, metric, fid[metric])
        add(part, n_large, loss, "seconds", result.seconds)
        add(part, n_large, loss, "cpu_seconds", result.cpu_seconds)
        add(part, n_large, loss, "torch_threads", threads)
        logger.info("embedding bench: %d genes, d=32, %d epochs, %s: %.1f s wall, %.1f s CPU, MAP %.3f", n_large,
                    epochs, loss, result.seconds, result.cpu_seconds, fid["map"])
        write_json(records, out / "embedding_scaling.json")
    return records


def run_benchmark(out: str | Path = "results/bench", *, quick: bool = False, dims=(2, 4, 8, 16, 32),
                  seeds=(0, 1, 2, 3, 4), epochs: int = 1000, sections=("fidelity", "scaling"),
                  n_nodes: int = 100, hierarchy_sizes=(300, 2000)) -> list[dict]:
    """``cape-bench embedding``.

    ``"fidelity"``: MAP / Spearman of hyperbolic vs Euclidean embeddings of ``n_nodes``-node BA DAGs at several
    dimensions, with the graph-distance oracle → ``embedding.json``, ``embedding.md``, ``embedding.png``.
    ``"scaling"``: time against M for the exact and the sampled loss, MAP of both at 300 genes, and the time
    of a 2,000-gene, d = 32, 1,000-epoch embedding → ``embedding_scaling.json``, ``.md``, ``.png``.
    ``"hierarchy"``: Spearman(π, −‖e‖) over all genes and over those with an edge, and the most general gene's rank,
    on :func:`sparse_hub_dag` graphs of ``hierarchy_sizes`` genes (every :data:`HIERARCHY_VARIANTS` at the first
    size; the default and per-anchor weights at the others and on the pbmc68k_reduced run's DAG, skipped with
    ``quick``), d = 32 → ``embedding_hierarchy.json``, ``.md``.
    """

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
                 f"Defaults: RSGD lr {DEFAULT_LR['hyperbolic', 'rsgd']} (Euclidean: SGD lr "
                 f"{DEFAULT_LR['euclidean', 'rsgd']}), temperature τ = {DEFAULT_TEMPERATURE}, initial spread 1e-3.",
                 "", mean_sd_table(fidelity, rows=["geometry", "dim"], columns=["metric"]), "",
                 "Per seed (MAP − oracle is the target: ≥ 0 on every seed):", "", _per_seed_table(fidelity), "",
                 f"Total {time.perf_counter() - start:.0f} s on this machine."]
        write_text("\n".join(lines) + "\n", out / "embedding.md")
        _plot(fidelity, out / "embedding.png")
    if "scaling" in sections:
        start = time.perf_counter()
        scaling = _scaling_records(quick, out)
        records += scaling

        lines = ["# Step II: time against M, exact against sampled loss (d = 32, BA DAGs, 2 edges per node)", "",
                 f"torch threads: {torch.get_num_threads()}. seconds = wall clock; cpu seconds = CPU time of the "
                 "process over all its threads (the cost on an otherwise idle machine; wall is inflated when the "
                 "machine is shared). 'time vs M' rows are measured on short runs and scaled to 1,000 epochs; "
                 "the other rows are full runs.", ""]
        for part in dict.fromkeys(r["part"] for r in scaling):
            lines += [f"## {part}", "",
                      mean_sd_table([r for r in scaling if r["part"] == part], rows=["n_genes", "loss"],
                                    columns=["metric"]), ""]
        lines += [f"Total {time.perf_counter() - start:.0f} s on this machine."]
        write_text("\n".join(lines) + "\n", out / "embedding_scaling.md")
        _plot_scaling(scaling, out / "embedding_scaling.png")
    if "hierarchy" in sections:
        sizes = (60,) if quick else tuple(hierarchy_sizes)
        hier_seeds = (0,) if quick else tuple(seeds)[:3]
        hier_epochs = min(epochs, 100) if quick else epochs
        graphs = {f"sparse hubs, {sizes[0]} genes": (lambda s, n=sizes[0]: sparse_hub_dag(n, seed=s), None)}
        hierarchy = _hierarchy_records(graphs, hier_seeds, hier_epochs, out=out)
        for n in sizes[1:]:
            hierarchy += _hierarchy_records({f"sparse hubs, {n} genes": (lambda s, n=n: sparse_hub_dag(n, seed=s),
                                                                         None)},
                                            hier_seeds, hier_epochs, _LARGE_VARIANTS, out=out)
        if not quick:
            dag, used = _pbmc_graph()
            hierarchy += _hierarchy_records({"pbmc68k_reduced (300 genes)": (lambda _s: dag, used)}, hier_seeds,
                                            hier_epochs, _LARGE_VARIANTS, out=out)
        records += hierarchy
        write_json(hierarchy, out / "embedding_hierarchy.json")
        lines = ["# Step II hierarchy on sparse graphs (d = 32, " f"{hier_epochs} epochs, seeds {list(hier_seeds)})",
                 "", "spearman_*: Spearman(π, −‖e‖) over the embedded genes / over the genes with an edge; hub_rank: "
                 "share of the genes with an edge nearer the origin than the most general one (0 = most central).",
                 "", mean_sd_table(hierarchy, rows=["graph", "variant"], columns=["metric"]), ""]
        write_text("\n".join(lines) + "\n", out / "embedding_hierarchy.md")
    return records


def _per_seed_table(records: list[dict]) -> str:
    """Markdown: per seed, the oracle MAP and each hyperbolic dimension's MAP − oracle and Spearman."""
    oracle = {r["seed"]: r["value"] for r in records if r["geometry"].startswith("oracle") and r["metric"] == "map"}
    hyper = {(r["seed"], r["dim"], r["metric"]): r["value"] for r in records if r["geometry"] == "hyperbolic"}
    dims = sorted({dim for _seed, dim, _metric in hyper})
    head = ["seed", "oracle MAP"] + [f"d={d}: MAP − oracle / Spearman" for d in dims]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for seed in sorted(oracle):
        cells = [str(seed), f"{oracle[seed]:.3f}"]
        cells += [f"{hyper[seed, d, 'map'] - oracle[seed]:+.3f} / {hyper[seed, d, 'spearman']:.3f}" for d in dims]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot(records: list[dict], path: Path) -> None:
    matplotlib.use("Agg")

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


def _plot_scaling(records: list[dict], path: Path) -> None:
    matplotlib.use("Agg")

    frame = pd.DataFrame(records)
    timing = frame[frame.part == "time vs M"]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for (loss, metric), sub in timing.groupby(["loss", "metric"]):
        sub = sub.sort_values("n_genes")
        ax.plot(sub["n_genes"], sub["value"], marker="o", ls="-" if metric.startswith("seconds") else ":",
                label=f"{loss}, {'wall' if metric.startswith('seconds') else 'CPU'}")
    ax.axhline(300, color="grey", ls="--", lw=0.8, label="5 minutes")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("genes M")
    ax.set_ylabel("seconds per 1,000 epochs (d = 32)")
    ax.set_title("Step II: exact vs negative-sampled loss")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
