"""A Hill-kinetics SDE simulator of single cells from a gene DAG, implemented from the equations of BoolODE
(Pratapa et al. 2020, *Nature Methods* 17:147–154, the BEELINE benchmark; Supplementary Note on BoolODE).

BoolODE turns a Boolean rule per gene into an ODE of mRNA ``x`` and protein ``p``:

``dx_i/dt = m_i · f_i(p) − l_x,i · x_i``,  ``dp_i/dt = r_i · x_i − l_p,i · p_i``,

with the rule's Hill form ``f_i = (α_0 + Σ_S α_S Π_{j∈S} (p_j / k_ji)^n) / (1 + Σ_S Π_{j∈S} (p_j / k_ji)^n)``:
``S`` runs over the non-empty sets of i's regulators, ``α_S`` is 1 where the rule is true with the regulators in
``S`` on and the others off (``α_0``: all off). Stochastic cells come from the chemical-Langevin-like SDE with noise
``σ·√y·dW`` on every variable (Euler–Maruyama; a step that would turn a variable negative keeps its old value, as
BoolODE does).
BoolODE's defaults: m 20, l_x 10, r 10, l_p 1 (each drawn within ±10 % per gene, normal with sd 10 %), so y_max =
m/l_x · r/l_p = 20 and the threshold k = y_max / 2 = 10, divided by an interaction strength ``s`` (``k_ji = k / s``);
Hill coefficient 10; noise amplitude 10 with Wiener increments of sd ``h`` (not √h) at step h = 0.01 in its code,
which is an amplitude of 10·√0.01 = 1 with proper increments: the value used here.

Choices made here (BoolODE takes curated Boolean models; here the network is a random DAG):

- each gene's rule is ``(a_1 or … or a_u) and not (r_1 or … or r_v)`` over its activators ``a`` and repressors
  ``r`` (``not (r_1 or …)`` without activators), BEELINE's synthetic-network form. Summing ``α_S`` over the sets then
  gives the closed form ``f = (Π_a (1 + h_a) − 1) / (Π_a (1 + h_a) · Π_r (1 + h_r))`` (``1 / Π_r (1 + h_r)`` without
  activators), ``h_j = (p_j / k_ji)^n``, which is what :func:`hill_activity` computes;
- genes without regulators are inputs: a constant activity ``u`` per cell type (low 0.05–0.3 or high 0.7–1.0,
  drawn per type; a single type draws u uniform in 0.2–0.8), as BoolODE's parameter inputs set its inputs' states;
- the Hill coefficient is 2 by default (BoolODE's 10 makes every gene a switch, so a population of one type carries
  almost no graded variation from parent to child); ``hill`` sets it;
- a cell's input activities scatter around its type's (normal, sd ``input_sd`` 0.15, clipped to [0, 1]): the
  graded cell-to-cell variation that BEELINE's cells get from being sampled along trajectories (a steady state with
  intrinsic noise alone carries too little of a parent's variation to its child to be seen through the counts);
- every cell is one trajectory, started at the deterministic steady state of its inputs and run for ``t_end`` time
  units (5 protein lifetimes, Euler step 0.02), its mRNA at the end is the cell's expression; counts are
  negative-binomial around the cell's expression share times a log-normal library size.

The code is written from the equations above; no BoolODE code is used.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["BOOLODE_DEFAULTS", "hill_activity", "random_dag_max_parents", "simulate_boolode"]

#: BoolODE's default kinetic parameters (its ``parameters.yaml``, the paper's Supplementary Note).
BOOLODE_DEFAULTS = {"m": 20.0, "l_x": 10.0, "r": 10.0, "l_p": 1.0}


def random_dag_max_parents(n_genes: int, n_edges: int, max_parents: int, rng: np.random.Generator) -> np.ndarray:
    """Random DAG of ``n_edges`` signed edges (±1), at most ``max_parents`` regulators per gene (i → j: W[i, j])."""
    if n_edges > max_parents * (n_genes - 1) - max_parents * (max_parents - 1) // 2:
        raise ValueError(f"{n_edges} edges do not fit {n_genes} genes with at most {max_parents} parents each")
    order = rng.permutation(n_genes)
    W = np.zeros((n_genes, n_genes))
    indegree = np.zeros(n_genes, dtype=int)
    while np.count_nonzero(W) < n_edges:
        a, b = np.sort(rng.choice(n_genes, 2, replace=False))
        child, parent = order[b], order[a]
        if W[parent, child] == 0 and indegree[child] < max_parents:
            W[parent, child] = rng.choice([-1.0, 1.0])
            indegree[child] += 1
    return W


def hill_activity(p: np.ndarray, sources: np.ndarray, thresholds: np.ndarray, hill: float,
                  activators: sp.csr_matrix, repressors: sp.csr_matrix, has_activator: np.ndarray) -> np.ndarray:
    """Each gene's rule activity ``f`` (cells × genes) from the proteins ``p`` (cells × genes), see the module."""
    h = (p[:, sources] / thresholds) ** hill  # cells × edges
    log_terms = np.log1p(h)
    log_act = np.asarray(log_terms @ activators)  # cells × genes: Σ_a log(1 + h_a)
    log_rep = np.asarray(log_terms @ repressors)
    numerator = np.where(has_activator, -np.expm1(-log_act), 1.0)  # (Π − 1) / Π, or 1 without activators
    return numerator * np.exp(-log_rep)


def _kinetics(n_genes: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """BoolODE's default rates, each drawn per gene from a normal with sd 10 % of the default, kept within ±10 %."""
    out = {}
    for name, default in BOOLODE_DEFAULTS.items():
        values = rng.normal(default, 0.1 * default, n_genes)
        bad = (values < 0.9 * default) | (values > 1.1 * default)
        while bad.any():
            values[bad] = rng.normal(default, 0.1 * default, int(bad.sum()))
            bad = (values < 0.9 * default) | (values > 1.1 * default)
        out[name] = values
    return out


def _input_levels(roots: np.ndarray, n_types: int, rng: np.random.Generator) -> np.ndarray:
    """Each input gene's constant activity per cell type (types × genes; NaN for the regulated genes)."""
    levels = np.full((n_types, roots.size), np.nan)
    for t in range(n_types):
        if n_types == 1:
            levels[t, roots] = rng.uniform(0.2, 0.8, roots.sum())
        else:
            high = rng.random(roots.sum()) < 0.5
            levels[t, roots] = np.where(high, rng.uniform(0.7, 1.0, roots.sum()), rng.uniform(0.05, 0.3, roots.sum()))
    return levels


def simulate_boolode(seed: int, n_cells: int = 3000, n_genes: int = 120, n_edges: int = 180, n_types: int = 3,
                     depth: float = 5000.0, dispersion: float = 3.0, strength: float = 1.0, hill: float = 2.0,
                     noise: float = 1.0, input_sd: float = 0.15, max_parents: int = 4, t_end: float = 5.0,
                     dt: float = 0.02) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """UMI counts of ``n_cells`` cells from BoolODE's SDE on a random DAG (see the module docstring).

    Parameters
    ----------
    seed
        Seeds the network, the kinetics, the trajectories and the counts.
    n_cells, n_genes, n_edges, max_parents
        Cells; the random DAG's size and its largest number of regulators per gene.
    n_types
        Cell types: each sets its own constant activity of every input gene.
    depth, dispersion
        Median library size (UMIs per cell; log-normal, σ 0.4) and the negative binomial's shape θ.
    strength
        BoolODE's interaction strength ``s``: every threshold is ``k / s``.
    hill, noise, t_end, dt
        Hill coefficient, the SDE's noise amplitude σ, the time each cell is simulated and the Euler step.
    input_sd
        Each cell's input activities scatter around its type's by this much (normal, clipped to [0, 1]).

    Returns
    -------
    Counts (cells × genes, int64), the true DAG (signed, ``W[i, j] ≠ 0``: i → j) and each cell's type.
    """
    rng = np.random.default_rng(seed)
    W = random_dag_max_parents(n_genes, n_edges, max_parents, rng)
    kin = _kinetics(n_genes, rng)
    sources, targets = np.nonzero(W)
    y_max = BOOLODE_DEFAULTS["m"] / BOOLODE_DEFAULTS["l_x"] * BOOLODE_DEFAULTS["r"] / BOOLODE_DEFAULTS["l_p"]
    thresholds = np.full(sources.size, y_max / 2.0 / strength)
    shape = (sources.size, n_genes)
    act = sp.csr_matrix(((W[sources, targets] > 0).astype(float), (np.arange(sources.size), targets)), shape=shape)
    rep = sp.csr_matrix(((W[sources, targets] < 0).astype(float), (np.arange(sources.size), targets)), shape=shape)
    has_act = np.asarray(act.sum(0)).ravel() > 0
    roots = ~(W != 0).any(0)
    levels = _input_levels(roots, n_types, rng)
    types = rng.integers(0, n_types, n_cells)
    inputs = np.clip(np.nan_to_num(levels[types]) + rng.normal(0.0, input_sd, (n_cells, n_genes)), 0.0, 1.0)

    def activity(p: np.ndarray) -> np.ndarray:
        return np.where(roots, inputs, hill_activity(p, sources, thresholds, hill, act, rep, has_act))

    # the deterministic steady state of each cell's type (exact after as many sweeps as the DAG is deep)
    p = np.zeros((n_cells, n_genes))
    for _ in range(n_genes):
        x = kin["m"] * activity(p) / kin["l_x"]
        p_new = kin["r"] * x / kin["l_p"]
        if np.allclose(p_new, p):
            break
        p = p_new
    for _ in range(round(t_end / dt)):
        drift_x = kin["m"] * activity(p) - kin["l_x"] * x
        drift_p = kin["r"] * x - kin["l_p"] * p
        x_new = x + drift_x * dt + noise * np.sqrt(x) * rng.normal(0.0, np.sqrt(dt), x.shape)
        p_new = p + drift_p * dt + noise * np.sqrt(p) * rng.normal(0.0, np.sqrt(dt), p.shape)
        x, p = np.where(x_new < 0, x, x_new), np.where(p_new < 0, p, p_new)
    library = rng.lognormal(np.log(depth), 0.4, n_cells)
    share = x / np.maximum(x.sum(1, keepdims=True), 1e-12)
    mu = share * library[:, None]
    counts = rng.negative_binomial(dispersion, dispersion / (dispersion + mu))
    return counts.astype(np.int64), W, types
