"""Perturbation data in GEARS format: knockouts simulated on a known DAG, and Sachs 2005 interventions.

GEARS format (Roohani et al. 2023): ``obs["condition"]`` is ``"ctrl"`` for control cells, ``"A+ctrl"`` for a single
perturbation of gene A and ``"A+B"`` for a double; ``obs["cell_type"]`` names the cell line; ``var["gene_name"]``
holds gene symbols (equal to the var names here).
"""

from __future__ import annotations

import logging
from itertools import combinations

import anndata as ad
import networkx as nx
import numpy as np
import pandas as pd
import scipy.sparse as sp

from .._errors import CapeInputError

logger = logging.getLogger("cape")

CONTROL = "ctrl"


def _upper_pairs(n: int, index: np.ndarray) -> np.ndarray:
    """The pairs (a, b), a < b, at ``index`` in the row-major list of an n × n upper triangle (the order of
    ``itertools.combinations(range(n), 2)``), found without listing its n(n − 1)/2 pairs."""
    starts = np.arange(n) * (n - 1) - np.arange(n) * (np.arange(n) - 1) // 2  # first index of each row a
    a = np.searchsorted(starts, index, side="right") - 1
    return np.stack([a, index - starts[a] + a + 1], axis=1).reshape(-1, 2)


def random_dag(n_genes: int, n_edges: int, *, weight_range: tuple[float, float] = (0.5, 2.0),
               rng: np.random.Generator) -> np.ndarray:
    """Erdős–Rényi DAG with exactly ``n_edges`` edges and signed weights; ``W[i, j] != 0`` means i → j.

    A random causal order is drawn, then ``n_edges`` distinct pairs that respect it; magnitudes are uniform in
    ``weight_range`` and signs are ±1 with equal probability (activation or repression).
    """
    max_edges = n_genes * (n_genes - 1) // 2
    if not 0 <= n_edges <= max_edges:
        raise CapeInputError(f"n_edges must be in [0, {max_edges}] for {n_genes} genes, got {n_edges}")
    order = rng.permutation(n_genes)
    chosen = _upper_pairs(n_genes, rng.choice(max_edges, size=n_edges, replace=False))
    weights = rng.uniform(*weight_range, size=n_edges) * rng.choice([-1.0, 1.0], size=n_edges)
    w = np.zeros((n_genes, n_genes))
    # Pair (a, b) with a < b in the causal order becomes the edge order[a] → order[b].
    w[order[chosen[:, 0]], order[chosen[:, 1]]] = weights
    return w


def sem_sample(w: np.ndarray, basal: np.ndarray, topo: list[int], n_cells: int, knocked: tuple[int, ...],
               noise: float, rng: np.random.Generator, *, hill: tuple[float, float] = (1.0, 1.0)) -> np.ndarray:
    """Cells from the SEM ``x_j = softplus(b_j + Σ_i W_ij · h(x_i) + ε_j)``; ``do(x_k = 0)`` for knocked k.

    ``basal`` is one drive per gene (shape genes) or one per cell and gene (cells × genes). The regulation is the
    Hill function ``h(x) = xⁿ / (Kⁿ + xⁿ)`` with ``hill = (K, n)``; the default (1, 1) is ``x / (1 + x)``.

    Genes are visited in topological order, so a knockout reaches every descendant and nothing else. The saturating
    regulation and the softplus output make the SEM nonlinear and keep values non-negative, on a
    log-expression-like scale (about 0–5).
    """
    half, n = hill
    if not (half > 0 and n > 0):
        raise CapeInputError(f"hill must be (K > 0, n > 0), got {hill}")
    # Genes are columns, stored contiguously (order="F"): every step reads and writes whole columns.
    eps = np.asfortranarray(rng.normal(0.0, noise, size=(n_cells, w.shape[0])))
    x = np.zeros_like(eps)
    # h(x) of the genes set so far (h(0) = 0 for the others): each column is computed once, when its gene is set
    regulation = np.zeros_like(eps)
    knocked = set(knocked)
    by_child = sp.csc_matrix(w)  # column j: gene j's parents (sorted) and their weights
    for j in topo:
        if j in knocked:
            continue  # do(x_j = 0): the gene's own mechanism is cut; its children see 0
        # Only the gene's parents enter its drive: O(cells × parents), not O(cells × genes), per gene.
        span = slice(by_child.indptr[j], by_child.indptr[j + 1])
        drive = basal[..., j] + regulation[:, by_child.indices[span]] @ by_child.data[span] + eps[:, j]
        x[:, j] = np.logaddexp(0.0, drive)
        powered = x[:, j] ** n
        regulation[:, j] = powered / (half**n + powered)
    del regulation, eps  # before the row-major copy, so that memory peaks at three matrices
    return np.ascontiguousarray(x)


def gears_condition(genes: tuple[str, ...]) -> str:
    """GEARS condition name: ``()`` → ``"ctrl"``, ``(A,)`` → ``"A+ctrl"``, ``(A, B)`` → ``"A+B"``."""
    if len(genes) == 0:
        return CONTROL
    if len(genes) == 1:
        return f"{genes[0]}+{CONTROL}"
    if len(genes) == 2:
        return f"{genes[0]}+{genes[1]}"
    raise CapeInputError(f"GEARS conditions hold at most 2 genes, got {len(genes)}: {'+'.join(genes)}")


#: The simulated perturbation data of the benchmarks (``cape-bench baselines/encodings/gears --dataset simulated``):
#: ``"quick"`` for smoke runs, ``"full"`` for the reported tables.
BENCHMARK_SIMULATIONS = {
    "quick": dict(n_genes=50, n_edges=100, n_control=300, n_cells_per_perturbation=40, n_single=20, n_double=30,
                  seed=0),
    "full": dict(n_genes=100, n_edges=200, n_control=1000, n_cells_per_perturbation=100, n_single=40, n_double=60,
                 seed=0),
}


def simulate_perturbation(
    n_genes: int = 50,
    n_edges: int = 80,
    n_control: int = 500,
    n_cells_per_perturbation: int = 50,
    n_single: int = 20,
    n_double: int = 20,
    *,
    noise: float = 0.3,
    weight_range: tuple[float, float] = (0.5, 2.0),
    seed: int = 0,
) -> ad.AnnData:
    """Simulate single and double knockouts on a known gene DAG, in GEARS format.

    Control cells come from a nonlinear structural equation model on a random DAG (see :func:`random_dag` and
    :func:`sem_sample`). Each perturbation sets its genes to 0 (``do(gene = 0)``) and re-samples the cells, so the
    effect propagates to all descendants in topological order. Perturbed genes are drawn preferring genes with
    children (knocking out a sink only changes the gene itself); doubles are pairs of single-perturbed genes, as
    in Norman et al. (2019), where most combinations' genes are also perturbed alone.

    Parameters
    ----------
    n_genes, n_edges
        Size of the random DAG.
    n_control
        Number of control cells (``condition == "ctrl"``).
    n_cells_per_perturbation
        Cells per single or double perturbation.
    n_single, n_double
        Number of single-gene and two-gene perturbations.
    noise
        Standard deviation of the Gaussian noise ε of the SEM.
    weight_range
        Range of the absolute edge weights.
    seed
        Seed of everything random here.

    Returns
    -------
    AnnData with non-negative ``X`` (cells × genes, float32), ``obs["condition"]``, ``obs["cell_type"]``
    (``"simulated"``), ``obs["n_perturbed"]``, ``var["gene_name"]``, ``varp["true_dag"]`` (sparse weighted
    adjacency, ``A[i, j] != 0`` means i → j) and ``uns["simulation"]`` (parameters and seed).
    """
    for name, value in (("n_genes", n_genes), ("n_control", n_control),
                        ("n_cells_per_perturbation", n_cells_per_perturbation)):
        if value < 2:
            raise CapeInputError(f"{name} must be at least 2, got {value}")
    if n_single < 0 or n_double < 0:
        raise CapeInputError("n_single and n_double must be non-negative")
    if n_single > n_genes:
        raise CapeInputError(f"n_single ({n_single}) exceeds n_genes ({n_genes})")
    if n_double > n_single * (n_single - 1) // 2:
        raise CapeInputError(f"n_double ({n_double}) exceeds the {n_single * (n_single - 1) // 2} pairs of "
                             f"{n_single} single-perturbed genes")
    rng = np.random.default_rng(seed)
    w = random_dag(n_genes, n_edges, weight_range=weight_range, rng=rng)
    graph = nx.from_numpy_array(w != 0, create_using=nx.DiGraph)
    topo = list(nx.topological_sort(graph))
    basal = rng.uniform(0.5, 2.0, size=n_genes)
    names = [f"G{i}" for i in range(n_genes)]

    # Prefer regulators: genes with children first (random order within each group).
    has_children = (w != 0).any(axis=1)
    shuffled = rng.permutation(n_genes)
    ranked = sorted(shuffled, key=lambda g: not has_children[g])
    singles = sorted(ranked[:n_single])
    pairs = list(combinations(singles, 2))
    doubles = [pairs[i] for i in sorted(rng.choice(len(pairs), size=n_double, replace=False))] if n_double else []

    blocks = [sem_sample(w, basal, topo, n_control, (), noise, rng)]
    conditions = [CONTROL] * n_control
    n_perturbed = [0] * n_control
    for knocked in [(g,) for g in singles] + doubles:
        blocks.append(sem_sample(w, basal, topo, n_cells_per_perturbation, knocked, noise, rng))
        conditions += [gears_condition(tuple(names[g] for g in knocked))] * n_cells_per_perturbation
        n_perturbed += [len(knocked)] * n_cells_per_perturbation

    x = np.vstack(blocks).astype(np.float32)
    order = [CONTROL, *dict.fromkeys(conditions[n_control:])]
    obs = pd.DataFrame(
        {"condition": pd.Categorical(conditions, categories=order), "cell_type": "simulated",
         "n_perturbed": np.asarray(n_perturbed, dtype=int)},
        index=[f"cell{i}" for i in range(len(conditions))],
    )
    obs["cell_type"] = obs["cell_type"].astype("category")
    adata = ad.AnnData(X=x, obs=obs, var=pd.DataFrame({"gene_name": names}, index=names))
    adata.varp["true_dag"] = sp.csr_matrix(w)
    adata.uns["simulation"] = {
        "model": "softplus(b + W^T x/(1+x) + eps), do(gene=0) knockouts",
        "n_genes": n_genes, "n_edges": n_edges, "n_control": n_control,
        "n_cells_per_perturbation": n_cells_per_perturbation, "n_single": n_single, "n_double": n_double,
        "noise": noise, "weight_range": list(weight_range), "seed": seed,
    }
    return adata


def sachs_interventions(adata: ad.AnnData, *, log1p: bool = True, shared_targets: bool = False) -> ad.AnnData:
    """Turn Sachs et al. (2005) (``cape.data.load("sachs2005")``) into a GEARS-format hold-out-intervention task.

    Observational cells (``obs["observational"]``: cd3cd28 and cd3cd28+icam2) become ``"ctrl"``; each condition
    whose ``obs["target"]`` is a measured protein becomes ``"<target>+ctrl"``. Conditions without a measured target
    are dropped. When two conditions share a target (g0076 inhibits and pma activates PKC), the first in file order
    is kept and the other dropped, with a warning: one condition per gene is what the GEARS format can express.
    With ``shared_targets=True`` both are kept under the same label (all 7,466 cells): what causal discovery with
    intervention labels needs, which asks only which gene each cell's perturbation targets.
    Intensities are ``log1p``-transformed by default (raw values span 1–9,000).

    Returns a new AnnData with ``obs["condition"]``, ``obs["sachs_condition"]`` (the original name),
    ``obs["cell_type"]`` (``"CD4+ T"``) and ``var["gene_name"]``; ``varp`` is kept.
    """
    for key in ("condition", "target", "observational"):
        if key not in adata.obs:
            raise CapeInputError(f"Sachs data needs obs[{key!r}] (as written by cape.data.load('sachs2005'))")
    observational = adata.obs["observational"].to_numpy(bool)
    if not observational.any():
        raise CapeInputError("Sachs data has no observational cells to use as control")
    original = adata.obs["condition"].astype(str).to_numpy()
    target = adata.obs["target"].astype(str).to_numpy()
    genes = set(adata.var_names)
    new = np.full(adata.n_obs, "", dtype=object)
    new[observational] = CONTROL
    used: dict[str, str] = {}
    for cond in dict.fromkeys(original[~observational]):
        tgt = target[original == cond][0]
        if tgt not in genes:
            logger.warning("Sachs condition %r targets %r, which is not measured; dropped", cond, tgt)
            continue
        if tgt in used and not shared_targets:
            logger.warning("Sachs condition %r targets %s like %r; dropped (one condition per gene)", cond, tgt,
                           used[tgt])
            continue
        used.setdefault(tgt, cond)
        new[(original == cond) & ~observational] = gears_condition((tgt,))
    keep = new != ""
    out = adata[keep].copy()
    if log1p:
        x = out.X.toarray() if sp.issparse(out.X) else np.asarray(out.X)
        out.X = np.log1p(np.clip(x, 0, None)).astype(np.float32)
    out.obs["sachs_condition"] = original[keep]
    order = [CONTROL] + [gears_condition((t,)) for t in used]
    out.obs["condition"] = pd.Categorical(new[keep].astype(str), categories=order)
    out.obs["cell_type"] = pd.Categorical(["CD4+ T"] * out.n_obs)
    out.var["gene_name"] = out.var_names.astype(str)
    return out
