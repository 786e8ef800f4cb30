"""Single-cell counts from a known gene regulatory DAG, where gene structure decides the outcome.

Cell types are states of a few regulator programs: each program is a regulator gene high in the cell types whose
binary code switches it on and low otherwise, and every difference between cell types reaches the other genes
only through the DAG's structural equations. Knock-outs (single and double, GEARS format) cut genes out of the
same equations. Counts carry the technical noise of droplet scRNA-seq: per-cell capture (library size),
negative-binomial sampling and dropout of lowly expressed transcripts. This is the ground truth of the oracle
experiment (``cape-bench encodings --dataset simulated_grn``): its true DAG is known, so CAPE on the true graph
can be set beside CAPE on Step I's graph.

Why not SERGIO (``sergio-scsim`` on PyPI, which installs offline): its v2 release has no intervention interface
(knock-outs would mean patching its internals) and it is GPL-3 licensed, while cape is MIT.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import anndata as ad
import networkx as nx
import numpy as np
import pandas as pd
import scanpy as sc
import scipy.sparse as sp

from .._errors import CapeInputError
from .expression import negative_binomial_counts
from .perturbation_data import CONTROL, gears_condition, random_dag, sem_sample

__all__ = ["GRN_SIMULATIONS", "CountNoise", "simulate_grn_cells"]

#: The oracle experiment's data (``--dataset simulated_grn``): ``"quick"`` for the powered quick runs, ``"full"``
#: for the full-size tables; ``"scale"``: the quick design at 2,000 genes and 10,000 control cells (Step I at scale,
#: ``cape-bench causal`` setting ``grn_control_2000``); ``"transcriptome"``: 10,000 genes and 50,000 control cells, no
#: knock-outs (Step I at whole-transcriptome scale, ``cape-bench throughput --design transcriptome``).
GRN_SIMULATIONS = {
    "quick": dict(n_genes=200, n_edges=300, n_control=2000, n_cell_types=5, n_programs=4, n_single=30, n_double=30,
                  n_cells_per_perturbation=30, seed=0),
    "full": dict(n_genes=500, n_edges=800, n_control=5000, n_cell_types=8, n_programs=5, n_single=60, n_double=60,
                 n_cells_per_perturbation=60, seed=0),
    "scale": dict(n_genes=2000, n_edges=3000, n_control=10000, n_cell_types=5, n_programs=4, n_single=30, n_double=30,
                  n_cells_per_perturbation=30, seed=0),
    "transcriptome": dict(n_genes=10000, n_edges=15000, n_control=50000, n_cell_types=5, n_programs=4, n_single=0,
                          n_double=0, n_cells_per_perturbation=30, seed=0),
}



@dataclass(frozen=True)
class CountNoise:
    """The technical noise of droplet scRNA-seq that :func:`simulate_grn_cells` puts on the transcripts.

    Attributes
    ----------
    depth
        Median library size (UMIs per cell over the simulated genes; log-normal around it, σ 0.4).
    dispersion
        Negative-binomial shape θ (variance μ + μ²/θ).
    dropout_midpoint
        UMIs at which half the molecules drop out (probability ``1 / (1 + μ / dropout_midpoint)``); 0: no dropout
        beyond sampling zeros.
    """

    depth: float = 1_000.0
    dispersion: float = 5.0
    dropout_midpoint: float = 0.5

    def __post_init__(self) -> None:
        if not (self.depth > 0 and self.dispersion > 0 and self.dropout_midpoint >= 0):
            raise CapeInputError(f"need depth > 0, dispersion > 0 and dropout_midpoint ≥ 0, got {self.depth}, "
                                 f"{self.dispersion}, {self.dropout_midpoint}")


# A program regulator's basal drive when its program is on / off (softplus output ≈ 3.0 / 0.13).
_PROGRAM_ON, _PROGRAM_OFF = 3.0, -2.0


def _program_codes(n_cell_types: int, n_programs: int, rng: np.random.Generator) -> np.ndarray:
    """``n_cell_types`` distinct binary codes over the programs, none all-off (cell types × programs, bool)."""
    n_codes = 2**n_programs - 1
    if n_cell_types > n_codes:
        raise CapeInputError(f"{n_programs} programs give only {n_codes} distinct cell-type codes; "
                             f"n_cell_types is {n_cell_types}")
    chosen = rng.choice(np.arange(1, n_codes + 1), size=n_cell_types, replace=False)
    return ((chosen[:, None] >> np.arange(n_programs)) & 1).astype(bool)


def _program_regulators(w: np.ndarray, n_programs: int, rng: np.random.Generator) -> np.ndarray:
    """The ``n_programs`` genes with the most descendants (ties at random), so each program reaches many genes."""
    graph = nx.from_numpy_array(w != 0, create_using=nx.DiGraph)
    reach = np.array([len(nx.descendants(graph, g)) for g in range(w.shape[0])])
    order = np.lexsort((rng.random(w.shape[0]), -reach))
    return np.sort(order[:n_programs])


def _technical_counts(x: np.ndarray, abundance: np.ndarray, noise: CountNoise,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """UMI counts from biological levels ``x`` (cells × genes): capture ∝ a log-normal library size, NB sampling,
    then dropout with probability ``1 / (1 + μ / midpoint)`` (half the molecules lost at μ = midpoint)."""
    library = noise.depth * np.exp(rng.normal(0.0, 0.4, size=x.shape[0]))
    rate = x * abundance
    mu = rate / np.maximum(rate.sum(axis=1, keepdims=True), 1e-12) * library[:, None]
    counts = negative_binomial_counts(mu, noise.dispersion, rng)
    if noise.dropout_midpoint > 0:
        kept = rng.random(mu.shape) >= noise.dropout_midpoint / (noise.dropout_midpoint + mu)
        counts = counts * kept
    return counts.astype(np.float32), library


def _check_grn_sizes(n_genes: int, n_control: int, n_cell_types: int, n_programs: int, n_single: int,
                     n_double: int, n_cells_per_perturbation: int) -> None:
    """One-line errors for sizes :func:`simulate_grn_cells` cannot honour."""
    if n_genes < 2 or n_control < n_cell_types or n_cell_types < 1:
        raise CapeInputError(f"need n_genes ≥ 2 and n_control ≥ n_cell_types ≥ 1, got {n_genes}, {n_control}, "
                             f"{n_cell_types}")
    if not 1 <= n_programs <= n_genes:
        raise CapeInputError(f"n_programs must be in [1, n_genes = {n_genes}], got {n_programs}")
    if n_single < 0 or n_double < 0 or n_single > n_genes:
        raise CapeInputError(f"n_single must be in [0, {n_genes}] and n_double ≥ 0, got {n_single}, {n_double}")
    if n_double > n_single * (n_single - 1) // 2:
        raise CapeInputError(f"n_double ({n_double}) exceeds the {n_single * (n_single - 1) // 2} pairs of "
                             f"{n_single} single-perturbed genes")
    if (n_single or n_double) and n_cells_per_perturbation < 2:
        raise CapeInputError(f"n_cells_per_perturbation must be at least 2, got {n_cells_per_perturbation}")


def _knockouts(w: np.ndarray, n_single: int, n_double: int,
               rng: np.random.Generator) -> tuple[list[int], list[tuple[int, int]]]:
    """Single knock-outs (genes with children first, so a knock-out has an effect) and doubles among their pairs."""
    has_children = (w != 0).any(axis=1)
    ranked = sorted(rng.permutation(w.shape[0]), key=lambda g: not has_children[g])
    singles = sorted(int(g) for g in ranked[:n_single])
    pairs = list(combinations(singles, 2))
    doubles = [pairs[i] for i in sorted(rng.choice(len(pairs), size=n_double, replace=False))] if n_double else []
    return singles, doubles


def _sample_conditions(w: np.ndarray, basal_by_type: np.ndarray, topo: list, names: list[str], n_control: int,
                       n_cell_types: int, knockouts: list[tuple[int, ...]], n_cells_per_perturbation: int,
                       noise: float, hill: tuple[float, float], rng: np.random.Generator,
                       ) -> tuple[np.ndarray, np.ndarray, list[str], list[int]]:
    """Log-scale levels of the controls, then of each knock-out's cells: (x, cell types, conditions, n_perturbed)."""
    control_types = np.arange(n_control) % n_cell_types
    # every knock-out's cell types are drawn before any cell is sampled (the order the seeded data depend on)
    plan = [((), control_types)] + [(k, rng.integers(0, n_cell_types, size=n_cells_per_perturbation))
                                    for k in knockouts]
    blocks, types, conditions, n_perturbed = [], [], [], []
    for knocked, cell_types in plan:
        blocks.append(sem_sample(w, basal_by_type[cell_types], topo, len(cell_types), knocked, noise, rng, hill=hill))
        types.append(cell_types)
        conditions += [gears_condition(tuple(names[g] for g in knocked))] * len(cell_types)
        n_perturbed += [len(knocked)] * len(cell_types)
    return np.vstack(blocks), np.concatenate(types), conditions, n_perturbed


def _grn_anndata(counts: np.ndarray, library: np.ndarray, types: np.ndarray, conditions: list[str],
                 n_perturbed: list[int], names: list[str], programs: np.ndarray, n_control: int,
                 n_cell_types: int) -> ad.AnnData:
    """The cells as AnnData: sparse counts in ``layers["counts"]``, log1p of counts per 10,000 in X, obs and var."""
    order = [CONTROL, *dict.fromkeys(conditions[n_control:])]
    obs = pd.DataFrame({"cell_type": pd.Categorical([f"type{t}" for t in types],
                                                    categories=[f"type{t}" for t in range(n_cell_types)]),
                        "condition": pd.Categorical(conditions, categories=order),
                        "n_perturbed": np.asarray(n_perturbed, dtype=int), "library_size": library},
                       index=[f"cell{i}" for i in range(len(conditions))])
    program = np.full(len(names), -1)
    program[programs] = np.arange(len(programs))
    adata = ad.AnnData(X=sp.csr_matrix(counts), obs=obs,
                       var=pd.DataFrame({"gene_name": names, "program": program}, index=names))
    adata.layers["counts"] = adata.X.copy()
    sc.pp.normalize_total(adata, target_sum=1e4)
    sc.pp.log1p(adata)
    adata.X = adata.X.astype(np.float32)
    return adata


def simulate_grn_cells(
    n_genes: int = 200,
    n_edges: int = 300,
    n_control: int = 2000,
    n_cell_types: int = 5,
    n_programs: int = 4,
    n_single: int = 30,
    n_double: int = 30,
    n_cells_per_perturbation: int = 30,
    *,
    noise: float = 1.0,
    hill: tuple[float, float] = (2.0, 2.0),
    counts: CountNoise | None = None,
    seed: int = 0,
) -> ad.AnnData:
    """Cells of several types and single/double knock-outs, from a known gene DAG, as counts and log expression.

    Biology: the nonlinear structural equations of :func:`cape.data.simulate_perturbation` on a log scale,
    ``x_j = softplus(b_cj + Σ_i W_ij · h(x_i) + ε_j)`` with the Hill regulation ``h(x) = xⁿ / (Kⁿ + xⁿ)``, on a
    random DAG with signed weights. The ``n_programs`` genes with the most descendants are program regulators;
    cell type t sets their basal drive ``b`` high (on) or low (off) by its binary code, other genes share one
    basal drive per gene. Knock-outs fix ``do(x_k = 0)`` in cells drawn from the same cell-type mixture as the
    controls.

    Technique: gene ``j``'s transcripts in cell ``c`` are ``(e^x_cj − 1) · a_j`` (``a_j`` a log-normal gene
    abundance), captured in proportion to a log-normal library size, sampled negative-binomially and dropped out
    (:class:`CountNoise`).

    Parameters
    ----------
    n_genes, n_edges
        Size of the random DAG.
    n_control
        Unperturbed cells (``condition == "ctrl"``), spread evenly over the cell types.
    n_cell_types, n_programs
        Cell types and the regulator programs whose on/off states define them (distinct codes, at least one
        program on).
    n_single, n_double, n_cells_per_perturbation
        Single- and two-gene knock-outs (regulators preferred; doubles pair single-perturbed genes, as in
        Norman 2019) and cells per knock-out.
    noise
        Standard deviation of the structural equations' Gaussian noise (log scale).
    hill
        ``(K, n)`` of the regulation: the defaults respond around the genes' typical levels, so a parent's
        variation reaches its children through the counts' technical noise (with ``x / (1 + x)`` and noise 0.3,
        parent–child correlations in the counts are no larger than between unrelated genes).
    counts
        Library size, negative-binomial shape and dropout of the counts (:class:`CountNoise`; default: its
        defaults).
    seed
        Seeds everything.

    Returns
    -------
    AnnData with ``X`` = log1p of counts per 10,000 (float32, what the benchmarks read), ``layers["counts"]``
    (sparse UMI counts), ``obs["cell_type"]``, ``obs["condition"]`` (GEARS: ``ctrl``, ``A+ctrl``, ``A+B``),
    ``obs["n_perturbed"]``, ``obs["library_size"]``, ``var["gene_name"]``, ``var["program"]`` (the program a
    regulator drives, else -1), ``varp["true_dag"]`` (weighted, ``A[i, j] != 0``: i → j) and
    ``uns["simulation"]`` (parameters, programs and the cell types' codes).
    """
    counts = CountNoise() if counts is None else counts
    _check_grn_sizes(n_genes, n_control, n_cell_types, n_programs, n_single, n_double, n_cells_per_perturbation)
    rng = np.random.default_rng(seed)
    w = random_dag(n_genes, n_edges, weight_range=(0.5, 2.0), rng=rng)
    topo = list(nx.topological_sort(nx.from_numpy_array(w != 0, create_using=nx.DiGraph)))
    programs = _program_regulators(w, n_programs, rng)
    codes = _program_codes(n_cell_types, n_programs, rng)
    basal = rng.uniform(0.5, 2.0, size=n_genes)
    basal_by_type = np.tile(basal, (n_cell_types, 1))
    basal_by_type[:, programs] = np.where(codes, _PROGRAM_ON, _PROGRAM_OFF)
    singles, doubles = _knockouts(w, n_single, n_double, rng)

    names = [f"G{i}" for i in range(n_genes)]
    x, types, conditions, n_perturbed = _sample_conditions(
        w, basal_by_type, topo, names, n_control, n_cell_types, [(g,) for g in singles] + doubles,
        n_cells_per_perturbation, noise, hill, rng)
    abundance = np.exp(rng.normal(0.0, 1.0, size=n_genes))
    # x is log-scale: transcripts ∝ e^x − 1, so a knocked-out gene (x = 0) has none
    umis, library = _technical_counts(np.expm1(x), abundance, counts, rng)

    adata = _grn_anndata(umis, library, types, conditions, n_perturbed, names, programs, n_control, n_cell_types)
    adata.varp["true_dag"] = sp.csr_matrix(w)
    adata.uns["simulation"] = {
        "simulator": "cape.data.simulate_grn_cells",
        "model": "x = softplus(b_type + W^T x^n/(K^n+x^n) + eps); counts NB(library · (e^x - 1) · a), dropout; "
                 "do(gene=0) knock-outs",
        "n_genes": n_genes, "n_edges": int((w != 0).sum()), "n_control": n_control, "n_cell_types": n_cell_types,
        "n_programs": n_programs, "program_genes": [names[g] for g in programs],
        "codes": {f"type{t}": codes[t].astype(int).tolist() for t in range(n_cell_types)},
        "n_single": n_single, "n_double": n_double, "n_cells_per_perturbation": n_cells_per_perturbation,
        "noise": noise, "hill": list(hill), "depth": counts.depth, "dispersion": counts.dispersion,
        "dropout_midpoint": counts.dropout_midpoint, "seed": seed,
    }
    return adata

