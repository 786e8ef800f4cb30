"""Intervention effects over a DAG's Markov equivalence class (IDA), for graphs learnt from observational cells.

From observational data alone a DAG is identified only up to its Markov equivalence class: the DAGs with the
same skeleton and the same v-structures (Verma & Pearl 1990) fit a linear-Gaussian model equally well, and
they can disagree on which way an edge at the intervened gene points, hence on what the intervention changes.
The class is summarised by its CPDAG (:func:`cpdag`): the edges every member orients the same way stay
directed, the others become undirected. Predicting do(x_g = v) from one member, as Step I's equations do, bets
on one orientation; IDA (Maathuis, Kalisch & Bühlmann 2009, Ann. Statist. 37:3133; used for knock-out
predictions from observational expression in Maathuis et al. 2010, Nat. Methods 7:247) instead lists the
parent sets of g that the class allows (:func:`local_parent_sets`), estimates g's total effect on every gene
under each by least squares with that set as the adjustment set (:func:`total_effects`), and averages them.

NumPy and networkx; exact against brute-force enumeration of the class on small graphs (tests).
"""

from __future__ import annotations

from itertools import combinations

import networkx as nx
import numpy as np

__all__ = ["MAX_PARENT_SETS", "TooManyParentSets", "cpdag", "equivalence_class_effects", "intervene_equivalence_class",
           "local_parent_sets", "possible_descendants", "total_effects"]

#: Most parent sets of the intervened gene enumerated (one least-squares fit of every gene per set).
MAX_PARENT_SETS = 4096


class TooManyParentSets(ValueError):
    """The intervened gene's equivalence class allows more parent sets than the limit (one fit per set)."""


def cpdag(dag: np.ndarray) -> np.ndarray:
    """The CPDAG of a DAG: boolean C with C[i, j] and not C[j, i] for a compelled edge i → j, both for an
    undirected (reversible) edge i — j.

    Starts from the pattern (the skeleton with the v-structures i → k ← j, i and j non-adjacent, directed) and
    applies Meek's rules R1–R3 until none fires (Meek 1995: from a pattern they yield the CPDAG; R4 is needed only
    with background knowledge). ``dag[i, j] != 0`` means i → j.
    """
    D = np.asarray(dag) != 0
    if D.ndim != 2 or D.shape[0] != D.shape[1]:
        raise ValueError(f"a DAG must be a square matrix, got shape {D.shape}")
    np.fill_diagonal(D, False)
    if (D & D.T).any():
        raise ValueError("the graph has an edge in both directions: not a DAG")
    n = D.shape[0]
    adjacent = D | D.T
    parents = [set(np.flatnonzero(D[:, k]).tolist()) for k in range(n)]
    directed = np.zeros_like(D)
    for k in range(n):
        pa = sorted(parents[k])
        for a, b in combinations(pa, 2):
            if not adjacent[a, b]:
                directed[a, k] = directed[b, k] = True
    undirected = adjacent & ~directed & ~directed.T
    neighbours = [set(np.flatnonzero(adjacent[k]).tolist()) for k in range(n)]

    def orient(a: int, b: int) -> None:
        directed[a, b] = True
        undirected[a, b] = undirected[b, a] = False

    changed = True
    while changed:
        changed = False
        for a, b in zip(*np.nonzero(np.triu(undirected)), strict=True):
            a, b = int(a), int(b)
            for x, y in ((a, b), (b, a)):
                if not undirected[x, y]:
                    break
                into_x = [p for p in neighbours[x] if directed[p, x]]
                # R1: p → x — y with p and y non-adjacent ⇒ x → y (else a new v-structure at x)
                r1 = any(not adjacent[p, y] for p in into_x if p != y)
                # R2: x → z → y and x — y ⇒ x → y (else a cycle)
                r2 = any(directed[x, z] and directed[z, y] for z in neighbours[x] & neighbours[y])
                # R3: x — c → y, x — d → y, c and d non-adjacent ⇒ x → y
                via = [c for c in neighbours[x] & neighbours[y] if undirected[x, c] and directed[c, y]]
                r3 = any(not adjacent[c, d] for c, d in combinations(via, 2))
                if r1 or r2 or r3:
                    orient(x, y)
                    changed = True
                    break
    return directed | undirected


def local_parent_sets(C: np.ndarray, gene: int, max_sets: int = MAX_PARENT_SETS) -> list[tuple[int, ...]]:
    """The parent sets of ``gene`` that members of the CPDAG ``C``'s class can give it (local IDA).

    Its compelled parents plus any subset S of its undirected neighbours such that directing S into the gene
    creates no new v-structure there: every member of S is adjacent to every other member of S and to every
    compelled parent (Maathuis et al. 2009, Lemma 3.1). So S is empty or a clique of the neighbours adjacent to
    all compelled parents, and the cliques are enumerated (networkx) rather than all 2^k subsets: a hub with
    dozens of undirected neighbours in a sparse graph has about as many sets as neighbours. The distinct sets
    are exactly those the class's members realise (the multiplicities may differ). Sorted, smallest first;
    raises :class:`TooManyParentSets` beyond ``max_sets`` sets.
    """
    C = np.asarray(C, dtype=bool)
    gene = int(gene)
    compelled = np.flatnonzero(C[:, gene] & ~C[gene, :]).tolist()
    adjacent = C | C.T
    siblings = [s for s in np.flatnonzero(C[:, gene] & C[gene, :]).tolist()
                if all(adjacent[s, p] for p in compelled)]
    among = nx.Graph()
    among.add_nodes_from(siblings)
    among.add_edges_from((a, b) for a, b in combinations(siblings, 2) if adjacent[a, b])
    sets = [tuple(compelled)]
    for clique in nx.enumerate_all_cliques(among):
        if len(sets) >= max_sets:
            raise TooManyParentSets(f"gene {gene} has more than {max_sets} possible parent sets in its equivalence "
                                    f"class ({len(siblings)} undirected neighbours in the CPDAG)")
        sets.append(tuple(sorted((*compelled, *clique))))
    return sorted(sets, key=lambda t: (len(t), t))


def possible_descendants(C: np.ndarray, gene: int, parent_set: tuple[int, ...] = ()) -> np.ndarray:
    """Genes reachable from ``gene`` along the CPDAG's directed or undirected edges without passing through one of
    its ``parent_set`` (a parent of the gene cannot be its descendant): a superset of its descendants in every
    member DAG that gives it those parents. Boolean mask, the gene itself excluded."""
    C = np.asarray(C, dtype=bool)
    blocked = np.zeros(C.shape[0], dtype=bool)
    blocked[list(parent_set)] = True
    seen = np.zeros(C.shape[0], dtype=bool)
    frontier = [int(gene)]
    seen[int(gene)] = True
    while frontier:
        node = frontier.pop()
        # C[node, k]: node → k or node — k; a parent of the gene is never its descendant (acyclicity)
        nxt = np.flatnonzero(C[node] & ~seen & ~blocked)
        seen[nxt] = True
        frontier.extend(nxt.tolist())
    seen[int(gene)] = False
    return seen


def total_effects(X: np.ndarray, gene: int, parent_set: tuple[int, ...]) -> np.ndarray:
    """Least-squares total effect of ``gene`` on every gene, adjusting for ``parent_set``: the coefficient of
    x_gene in the regression of x_k on (1, x_gene, x_parents). A parent set blocks every back-door path, so in a
    linear SEM whose DAG gives ``gene`` these parents this is ∂E[x_k | do(x_gene)]/∂x_gene. The parents' own
    effect is 0 (they precede the gene) and the gene's is 1.

    Computed by Frisch–Waugh–Lovell: with r the residual of x_gene on (1, x_parents), the coefficient is
    r·x_k / r·r, one product with X instead of a regression per gene."""
    X = np.asarray(X, dtype=np.float64)
    parents = list(map(int, parent_set))
    design = np.column_stack([np.ones(X.shape[0]), X[:, parents]])
    x = X[:, int(gene)]
    r = x - design @ np.linalg.lstsq(design, x, rcond=None)[0]
    rr = float(r @ r)
    centred = x - x.mean()
    if not rr > 1e-10 * float(centred @ centred):  # relative: collinearity leaves rounding-level residuals
        raise ValueError(f"gene {gene} is a linear function of its parent set {tuple(parents)}: its effect is not "
                         "identified")
    coef = (r @ X) / rr
    coef[parents] = 0.0
    coef[int(gene)] = 1.0
    return coef


def equivalence_class_effects(X: np.ndarray, dag: np.ndarray, gene: int,
                              max_sets: int = MAX_PARENT_SETS) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """IDA: ``gene``'s total effect on every gene under each parent set its class allows.

    Returns (effects, parent_sets): effects[s, k] the effect of a unit change of x_gene on x_k when the gene's
    parents are ``parent_sets[s]``; 0 for genes that cannot be its descendants in such a member DAG
    (:func:`possible_descendants`), so genes outside its reach stay untouched. The IDA prediction of
    do(x_gene = v) for a cell is x + effects.mean(0)·(v − x_gene).
    """
    C = cpdag(dag)
    sets = local_parent_sets(C, gene, max_sets)
    effects = np.zeros((len(sets), C.shape[0]))
    for s, parents in enumerate(sets):
        reach = possible_descendants(C, gene, parents)
        reach[int(gene)] = True
        effects[s] = np.where(reach, total_effects(X, gene, parents), 0.0)
    return effects, sets


def intervene_equivalence_class(X: np.ndarray, dag: np.ndarray, gene: int, value: float | np.ndarray, *,
                                mode: str = "counterfactual", n_cells: int | None = None, seed: int = 0,
                                max_sets: int = MAX_PARENT_SETS
                                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, ...]]]:
    """Cells under do(x_gene = value) by IDA over ``dag``'s equivalence class, and the same cells without it.

    ``value``: a scalar, or one value per output cell.
    Each cell moves by the class-averaged total effects times its own change of x_gene, x + β̄·(value − x_gene):
    in a linear SEM that is the counterfactual of the cell exactly, for each member, and the average over the
    parent sets the class allows is IDA's point prediction. ``mode="counterfactual"``: the observed cells
    (``n_cells`` drawn without replacement, else all); ``"interventional"``: ``n_cells`` (default X's rows) cells
    drawn with replacement, whose counterfactuals are, in a linear SEM with independent noise, a sample of the
    interventional distribution. Returns (predicted, reference, effects, parent_sets) with effects and
    parent_sets as :func:`equivalence_class_effects` gives them.
    """
    if mode not in ("counterfactual", "interventional"):
        raise ValueError(f"mode must be counterfactual or interventional, got {mode!r}")
    X = np.asarray(X, dtype=np.float64)
    effects, sets = equivalence_class_effects(X, dag, gene, max_sets)
    rng = np.random.default_rng(seed)
    n_obs = X.shape[0]
    if mode == "counterfactual":
        rows = np.sort(rng.choice(n_obs, size=n_cells, replace=False)) if n_cells is not None and n_cells < n_obs \
            else np.arange(n_obs)
    else:
        rows = rng.integers(0, n_obs, size=n_obs if n_cells is None else int(n_cells))
    reference = X[rows]
    values = np.broadcast_to(np.asarray(value, dtype=np.float64), rows.shape)
    predicted = reference + np.outer(values - reference[:, int(gene)], effects.mean(0))
    predicted[:, int(gene)] = values  # exact, not 1·Δ added in floating point
    return predicted, reference.copy(), effects, sets
