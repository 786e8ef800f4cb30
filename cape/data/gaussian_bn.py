"""Linear Gaussian Bayesian networks learnt from real expression data (bnlearn's ecoli70, arth150), and cells
sampled from them with and without knock-downs.

The networks ship as JSON inside the pgmpy wheel (``pgmpy/utils/example_models/*.json``, from the bnlearn
repository): for each gene its parents, regression coefficients, intercept and residual variance. cape reads that
file itself (:func:`read_gaussian_bn`) instead of calling pgmpy, whose loader is deprecated, so the datasets need
only the file (``cape.data.fetch("ecoli70")``). In row form each gene is

    x_j = c_j + Σ_i B_ij x_i + e_j,   e_j ~ N(0, v_j),

so a cell is x = (c + e)(I − B)⁻¹, its mean μ = c(I − B)⁻¹ and its covariance (I − B)⁻ᵀ diag(v) (I − B)⁻¹. A
knock-down of gene g is the intervention do(x_g = μ_g − ``depth``·σ_g): g's own equation is replaced by that
constant, and every other equation is kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import anndata as ad
import networkx as nx
import numpy as np
import pandas as pd
import scipy.sparse as sp

from .._errors import CapeInputError
from .perturbation_data import CONTROL, gears_condition

__all__ = ["GaussianBN", "read_gaussian_bn"]

#: Knock-down depth in observational standard deviations below the gene's mean.
KNOCKDOWN_DEPTH = 3.0


@dataclass(frozen=True)
class GaussianBN:
    """A linear Gaussian network: ``weights[i, j]`` is gene i's coefficient in gene j's equation (i → j)."""

    genes: tuple[str, ...]
    weights: np.ndarray
    intercepts: np.ndarray
    variances: np.ndarray
    name: str = "gaussian_bn"

    @property
    def n_genes(self) -> int:
        return len(self.genes)

    def _propagator(self, weights: np.ndarray) -> np.ndarray:
        """(I − B)⁻¹ for a DAG's B (unit triangular after ordering, so always invertible)."""
        return np.linalg.inv(np.eye(self.n_genes) - weights)

    def mean(self) -> np.ndarray:
        """Observational mean μ = c(I − B)⁻¹."""
        return self.intercepts @ self._propagator(self.weights)

    def covariance(self) -> np.ndarray:
        """Observational covariance (I − B)⁻ᵀ diag(v) (I − B)⁻¹."""
        P = self._propagator(self.weights)
        return P.T @ (self.variances[:, None] * P)

    def sample(self, n_cells: int, rng: np.random.Generator, do: dict[int, float] | None = None) -> np.ndarray:
        """``n_cells`` × genes, with the genes in ``do`` (index → value) held at their values."""
        weights, intercepts, sd = self.weights.copy(), self.intercepts.copy(), np.sqrt(self.variances)
        noise = rng.standard_normal((n_cells, self.n_genes)) * sd
        for g, value in (do or {}).items():
            weights[:, g] = 0.0
            intercepts[g] = value
            noise[:, g] = 0.0
        return (intercepts + noise) @ self._propagator(weights)

    def simulate(self, n_control: int = 2000, knockdowns: int | list[str] = 0, cells_per_knockdown: int = 100,
                 depth: float = KNOCKDOWN_DEPTH, seed: int = 0) -> ad.AnnData:
        """Cells as AnnData: ``n_control`` observational cells, then ``cells_per_knockdown`` cells per knock-down.

        Parameters
        ----------
        n_control
            Observational cells (``obs["condition"] == "ctrl"``).
        knockdowns
            Genes to knock down, or how many: the genes with the most descendants first (ties by name).
        cells_per_knockdown
            Cells per knock-down (``obs["condition"] == "<gene>+ctrl"``, GEARS format).
        depth
            A knocked-down gene is held at its observational mean minus ``depth`` standard deviations.
        seed
            Seed of the noise.

        Returns
        -------
        AnnData with the expression in ``X`` (float32; values are log-scale and may be negative),
        ``obs["condition"]``, ``varp["true_dag"]`` (the coefficients, sparse, A[i, j] ≠ 0: i → j) and the
        network and sizes in ``uns["simulation"]``.
        """
        if n_control < 0 or cells_per_knockdown < 1:
            raise CapeInputError(f"n_control must be ≥ 0 and cells_per_knockdown ≥ 1, got {n_control}, "
                                 f"{cells_per_knockdown}")
        targets = self._knockdown_targets(knockdowns)
        if n_control + len(targets) == 0:
            raise CapeInputError("nothing to simulate: n_control is 0 and no knock-down was asked for")
        rng = np.random.default_rng(seed)
        mu, sigma = self.mean(), np.sqrt(np.diag(self.covariance()))
        blocks, conditions = [self.sample(n_control, rng)], [CONTROL] * n_control
        for g in targets:
            blocks.append(self.sample(cells_per_knockdown, rng, do={g: float(mu[g] - depth * sigma[g])}))
            conditions += [gears_condition((self.genes[g],))] * cells_per_knockdown
        X = np.vstack(blocks).astype(np.float32)
        order = [CONTROL, *(gears_condition((self.genes[g],)) for g in targets)]
        adata = ad.AnnData(X=X, obs=pd.DataFrame({"condition": pd.Categorical(conditions, categories=order)},
                                                 index=[f"cell{i}" for i in range(X.shape[0])]),
                           var=pd.DataFrame(index=list(self.genes)))
        adata.varp["true_dag"] = sp.csr_matrix(self.weights)
        adata.uns["simulation"] = {"network": self.name, "n_control": int(n_control),
                                   "knockdowns": [self.genes[g] for g in targets],
                                   "cells_per_knockdown": int(cells_per_knockdown), "depth": float(depth),
                                   "seed": int(seed)}
        return adata

    def _knockdown_targets(self, knockdowns: int | list[str]) -> list[int]:
        if isinstance(knockdowns, (int, np.integer)):
            if not 0 <= knockdowns <= self.n_genes:
                raise CapeInputError(f"knockdowns must be between 0 and {self.n_genes}, got {knockdowns}")
            graph = nx.from_numpy_array((self.weights != 0).astype(int), create_using=nx.DiGraph)
            by_reach = sorted(range(self.n_genes), key=lambda g: (-len(nx.descendants(graph, g)), self.genes[g]))
            return by_reach[: int(knockdowns)]
        index = {g: i for i, g in enumerate(self.genes)}
        missing = [g for g in knockdowns if g not in index]
        if missing:
            raise CapeInputError(f"knock-down genes not in {self.name}: {', '.join(missing)}")
        return [index[g] for g in dict.fromkeys(knockdowns)]


def read_gaussian_bn(path: str | Path, name: str | None = None) -> GaussianBN:
    """Read a linear Gaussian network in bnlearn/pgmpy JSON (``nodes``; ``cpds``: per gene ``parents``,
    ``coefficients`` with ``(Intercept)``, ``variance``)."""
    path = Path(path)
    try:
        spec = json.loads(path.read_text())
        genes = [str(g) for g in spec["nodes"]]
        cpds = spec["cpds"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CapeInputError(f"{path}: not a Gaussian network in bnlearn JSON ({err})") from err
    index = {g: i for i, g in enumerate(genes)}
    m = len(genes)
    weights, intercepts, variances = np.zeros((m, m)), np.zeros(m), np.zeros(m)
    for gene in genes:
        cpd = cpds.get(gene)
        if cpd is None:
            raise CapeInputError(f"{path}: no distribution for gene {gene}")
        coefficients = cpd.get("coefficients", {})
        j = index[gene]
        intercepts[j] = float(np.ravel(coefficients.get("(Intercept)", [0.0]))[0])
        variances[j] = float(np.ravel(cpd.get("variance", [np.nan]))[0])
        for parent in cpd.get("parents", []):
            if parent not in index:
                raise CapeInputError(f"{path}: {gene}'s parent {parent} is not a node")
            weights[index[parent], j] = float(np.ravel(coefficients[parent])[0])
    if not np.all(np.isfinite(variances) & (variances > 0)):
        raise CapeInputError(f"{path}: every gene needs a positive residual variance")
    if not nx.is_directed_acyclic_graph(nx.from_numpy_array((weights != 0).astype(int), create_using=nx.DiGraph)):
        raise CapeInputError(f"{path}: the network has a cycle")
    return GaussianBN(tuple(genes), weights, intercepts, variances, name or path.stem)
