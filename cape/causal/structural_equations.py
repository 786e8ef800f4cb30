"""Interventions on a structural equation model: do(x_g = v) propagated in topological order.

Two kinds of structural equations over M genes, both with one equation per gene and a DAG of parents:

* ``"learned"``: Step I's SEM (:class:`~cape.causal.VariationalNotears`). With u = (x − μ)/σ the trainer's
  standardisation, the encoder feature of gene j is F_j = (f_j(u_j) − m_j)/s_j (f_j its element-wise MLP,
  m_j and s_j the normalisation of f(X)), and the SEM is linear in those features,
  F_j = Σ_i A_ij F_i + Z_j, with the decoder reading them back, x_j = μ_j + σ_j·g_j(F_j) + r_j
  (r_j the decoder's residual). A is the thresholded DAG.
* ``"linear"``: x_j = b_j + Σ_i W_ij x_i + e_j, each gene refit on its graph parents by least squares
  (:func:`linear_equations`): works with any graph (a consensus graph, a peer's), in the data's units.
* ``"parents_mlp"``: Step I's nonlinear-parents SEM (:class:`~cape.causal.ParentsMLP`), x_j = μ_j + σ_j·
  (b2_j + Σ_k w2_jk·sigmoid(Σ_i W_jik·u_i + b1_jk)) + e_j with u = (x − μ)/σ, the sum over the DAG's parents
  only (each edge i → j keeps its first-layer weights W_ji·; the weight of the edge is their norm).

Abduction recovers each cell's exogenous terms (Z and r, or e) from its observed x. ``do`` then fixes the
intervened genes and recomputes their descendants in topological order:

* counterfactual: every cell keeps its own exogenous terms; the change is propagated as a difference
  (ΔF_j = Σ_i A_ij ΔF_i, x'_j = x_j + σ_j·(g_j(F_j + ΔF_j) − g_j(F_j))), so a gene the intervention does
  not reach keeps its observed value bit for bit, and do(x_g = observed x_g) returns the data exactly;
* interventional: each gene's exogenous terms are drawn independently (the SEM's independent noise) from
  those abducted on the observed cells, new cells are generated from the roots down, and the shift is
  measured against cells generated from the same draws without the intervention.

NumPy only (float64); no AnnData: :func:`cape.tl.predict_intervention` is the AnnData-facing tool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import networkx as nx
import numpy as np
import scipy.sparse as sp
import torch
from scipy.special import expit

from .parents_mlp import ParentsMLP

__all__ = ["StructuralEquations", "descendants", "intervene", "learned_equations", "linear_equations",
           "parents_mlp_equations", "topological_order"]

KINDS = ("learned", "linear", "parents_mlp")
MODES = ("counterfactual", "interventional")
#: Elements (rows × genes × hidden units) of one block of the element-wise MLPs in NumPy (32 MiB in float64).
MLP_BLOCK_ELEMENTS = 1 << 22
#: Arrays a ``"learned"`` model holds besides the graph (the element-wise MLPs and the two normalisations).
_LEARNED_KEYS = ("mean", "std", "enc_w1", "enc_b1", "enc_w2", "enc_b2", "feat_mean", "feat_scale",
                 "dec_w1", "dec_b1", "dec_w2", "dec_b2")
#: Arrays a ``"parents_mlp"`` model holds: the standardisation, each edge's first-layer weights (edges × hidden,
#: in the order of ``source``/``target``) and each gene's hidden biases, output weights and output bias.
_PARENTS_MLP_KEYS = ("mean", "std", "edge_w1", "b1", "w2", "b2")
_KEYS = {"learned": _LEARNED_KEYS, "parents_mlp": _PARENTS_MLP_KEYS}


def topological_order(n_genes: int, source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """A topological order of the graph with edges source[k] → target[k] (every gene listed once).

    Raises ``ValueError`` when the edges contain a cycle.
    """
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n_genes))
    graph.add_edges_from(zip(np.asarray(source).tolist(), np.asarray(target).tolist(), strict=True))
    try:
        # lexicographic: the same graph always gives the same order
        return np.asarray(list(nx.lexicographical_topological_sort(graph)), dtype=np.int64)
    except nx.NetworkXUnfeasible as err:
        raise ValueError("the graph of the structural equations has a cycle") from err


def descendants(n_genes: int, source: np.ndarray, target: np.ndarray, genes) -> np.ndarray:
    """Boolean mask of the genes reachable from ``genes`` by a directed path (the genes themselves excluded)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n_genes))
    graph.add_edges_from(zip(np.asarray(source).tolist(), np.asarray(target).tolist(), strict=True))
    mask = np.zeros(n_genes, dtype=bool)
    for g in genes:
        mask[list(nx.descendants(graph, int(g)))] = True
    mask[list(map(int, genes))] = False
    return mask


@dataclass
class StructuralEquations:
    """One structural equation per gene over a DAG given as weighted edges ``source → target``.

    Attributes
    ----------
    kind
        ``"learned"`` (Step I's encoder, feature-space SEM and decoder), ``"parents_mlp"`` (Step I's
        nonlinear-parents model) or ``"linear"`` (least squares on the parents, in data units); see the module
        docstring.
    source, target, weight
        The edges (gene indices) and their weights: A_ij in feature space (learned) or W_ij (linear).
    order
        A topological order of all genes.
    intercept
        Linear only: b_j.
    params
        Learned: the arrays of :data:`_LEARNED_KEYS` (standardisation ``mean``/``std``, encoder MLP
        ``enc_*``, feature normalisation ``feat_mean``/``feat_scale``, decoder MLP ``dec_*``); parents MLP:
        those of :data:`_PARENTS_MLP_KEYS`.
    """

    kind: str
    source: np.ndarray
    target: np.ndarray
    weight: np.ndarray
    order: np.ndarray
    intercept: np.ndarray | None = None
    params: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        self.source = np.asarray(self.source, dtype=np.int64)
        self.target = np.asarray(self.target, dtype=np.int64)
        self.weight = np.asarray(self.weight, dtype=np.float64)
        self.order = np.asarray(self.order, dtype=np.int64)
        if self.kind in _KEYS:
            missing = [k for k in _KEYS[self.kind] if k not in self.params]
            if missing:
                raise ValueError(f"{self.kind} structural equations lack {', '.join(missing)}")
            self.params = {k: np.asarray(self.params[k], dtype=np.float64) for k in _KEYS[self.kind]}
        elif self.intercept is None:
            raise ValueError("linear structural equations need an intercept per gene")
        else:
            self.intercept = np.asarray(self.intercept, dtype=np.float64)

    @property
    def n_genes(self) -> int:
        return int(self.order.size)

    # --- graph ----------------------------------------------------------------------------------------
    def parents(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per gene: (parent indices, edge weights)."""
        out = []
        for j in range(self.n_genes):
            k = np.flatnonzero(self.target == j)
            out.append((self.source[k], self.weight[k]))
        return out

    def descendants(self, genes) -> np.ndarray:
        """Boolean mask of the genes downstream of ``genes`` (see :func:`descendants`)."""
        return descendants(self.n_genes, self.source, self.target, genes)

    # --- per-gene maps (learned) ----------------------------------------------------------------------
    @staticmethod
    def _mlp(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray) -> np.ndarray:
        """y_j = x_j + Σ_h w2_jh·silu(w1_jh·x_j + b1_jh) + b2_j (the element-wise MLP of the model).

        Rows go through in blocks of about ``MLP_BLOCK_ELEMENTS`` hidden units: the whole cells × genes ×
        hidden array would take gigabytes at a few thousand genes, and small blocks stay in cache.
        """
        x = np.asarray(x, dtype=np.float64)
        rows = max(1, MLP_BLOCK_ELEMENTS // max(1, x[0].size * w1.shape[-1])) if x.ndim >= 2 and len(x) else 0
        if not rows or len(x) <= rows:
            pre = x[..., None] * w1 + b1
            return x + (pre * expit(pre) * w2).sum(-1) + b2
        out = np.empty(np.broadcast_shapes(x.shape, b2.shape))
        for start in range(0, len(x), rows):
            block = x[start:start + rows]
            pre = block[..., None] * w1 + b1
            out[start:start + rows] = block + (pre * expit(pre) * w2).sum(-1) + b2
        return out

    def features(self, x: np.ndarray, genes: slice | np.ndarray = slice(None)) -> np.ndarray:
        """F = (f(u) − m)/s for data x (cells × the selected genes)."""
        p = self.params
        u = (x - p["mean"][genes]) / p["std"][genes]
        h = self._mlp(u, p["enc_w1"][genes], p["enc_b1"][genes], p["enc_w2"][genes], p["enc_b2"][genes])
        return (h - p["feat_mean"][genes]) / p["feat_scale"][genes]

    def decode(self, F: np.ndarray, genes: slice | np.ndarray = slice(None)) -> np.ndarray:
        """μ + σ·g(F): the decoder's reading of features F in data units."""
        p = self.params
        g = self._mlp(F, p["dec_w1"][genes], p["dec_b1"][genes], p["dec_w2"][genes], p["dec_b2"][genes])
        return p["mean"][genes] + p["std"][genes] * g

    # --- per-gene equations (parents MLP) --------------------------------------------------------------
    def mlp_mean(self, X: np.ndarray, j: int) -> np.ndarray:
        """Gene j's structural mean μ_j + σ_j·g_j(u_pa(j)) in data units, for cells X (all genes' columns)."""
        p = self.params
        k = np.flatnonzero(self.target == j)
        pa = self.source[k]
        u = (X[:, pa] - p["mean"][pa]) / p["std"][pa]
        hidden = expit(u @ p["edge_w1"][k] + p["b1"][j])
        return p["mean"][j] + p["std"][j] * (hidden @ p["w2"][j] + p["b2"][j])

    # --- abduction ------------------------------------------------------------------------------------
    def abduct(self, X: np.ndarray) -> dict[str, np.ndarray]:
        """Each cell's exogenous terms: ``{"F", "Z", "R"}`` (learned) or ``{"E"}`` (linear, parents MLP)."""
        X = np.asarray(X, dtype=np.float64)
        parents = self.parents()
        if self.kind == "parents_mlp":
            return {"E": X - np.column_stack([self.mlp_mean(X, j) for j in range(self.n_genes)])}
        if self.kind == "linear":
            E = X - self.intercept
            for j, (pa, w) in enumerate(parents):
                if pa.size:
                    E[:, j] -= X[:, pa] @ w
            return {"E": E}
        F = self.features(X)
        Z = F.copy()
        for j, (pa, w) in enumerate(parents):
            if pa.size:
                Z[:, j] -= F[:, pa] @ w
        return {"F": F, "Z": Z, "R": X - self.decode(F)}

    # --- storage --------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, np.ndarray | str]:
        """Arrays and strings only (h5ad-serialisable)."""
        out: dict[str, np.ndarray | str] = {"kind": self.kind, "source": self.source, "target": self.target,
                                            "weight": self.weight, "order": self.order}
        if self.kind == "linear":
            out["intercept"] = self.intercept
        else:
            out |= {k: v for k, v in self.params.items()}
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> StructuralEquations:
        """The inverse of :meth:`to_dict` (extra keys are ignored)."""
        kind = str(d["kind"])
        params = {k: np.asarray(d[k]) for k in _KEYS[kind]} if kind in _KEYS else {}
        return cls(kind=kind, source=np.asarray(d["source"]), target=np.asarray(d["target"]),
                   weight=np.asarray(d["weight"]), order=np.asarray(d["order"]),
                   intercept=np.asarray(d["intercept"]) if kind == "linear" else None, params=params)


def _edges(dag: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dag = np.asarray(dag)
    if dag.ndim != 2 or dag.shape[0] != dag.shape[1]:
        raise ValueError(f"the graph must be a square adjacency matrix, got shape {dag.shape}")
    source, target = np.nonzero(dag)
    return source, target, dag[source, target].astype(np.float64)


def learned_equations(model, mean: np.ndarray, std: np.ndarray, X: np.ndarray, dag: np.ndarray,
                      batch: int = 4096) -> StructuralEquations:
    """Step I's structural equations from a fitted :class:`~cape.causal.VariationalNotears` (or
    :class:`~cape.causal.ParentsMLP`: see :func:`parents_mlp_equations`).

    X (dense or sparse, read in row chunks) is the matrix the model was fitted on; ``mean``/``std`` the
    standardisation the trainer applied to it; ``dag`` the thresholded adjacency (feature-space weights,
    A[i, j]: i → j). The normalisation of f(X) is taken from all of X's cells (what training's batch
    statistics estimate): per-gene mean and standard deviation (divided by the model's ``feature_scale``).
    """
    if isinstance(model, ParentsMLP):
        return parents_mlp_equations(model, mean, std, dag)
    mean = np.asarray(mean, dtype=np.float64)
    std = np.asarray(std, dtype=np.float64)

    def mlp(m) -> list[np.ndarray]:
        return [t.detach().double().cpu().numpy() for t in (m.w1, m.b1, m.w2, m.b2)]

    enc, dec = mlp(model.encoder_mlp), mlp(model.decoder_mlp)
    h_sum, h_sq = _encoder_moments(model.encoder_mlp, mean, std, X, batch)
    n = max(X.shape[0], 1)
    feat_mean = h_sum / n
    var = np.maximum(h_sq / n - feat_mean**2, 0.0)
    eps = float(model.feature_norm.eps)
    feat_scale = np.sqrt(var + eps) / model.feature_scale.detach().double().cpu().numpy()
    source, target, weight = _edges(dag)
    params = {"mean": mean, "std": std, "enc_w1": enc[0], "enc_b1": enc[1], "enc_w2": enc[2], "enc_b2": enc[3],
              "feat_mean": feat_mean, "feat_scale": feat_scale, "dec_w1": dec[0], "dec_b1": dec[1],
              "dec_w2": dec[2], "dec_b2": dec[3]}
    return StructuralEquations("learned", source, target, weight, topological_order(X.shape[1], source, target),
                               params=params)


#: Elements of the (cells × genes × hidden) float64 activation :func:`_encoder_moments` forms at once, per device.
ENCODER_BLOCK_ELEMENTS = {"cpu": 1 << 22, "cuda": 1 << 26}


def _encoder_moments(mlp, mean: np.ndarray, std: np.ndarray, X, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Σ h and Σ h² per gene over X's cells of the encoder's output h = f((x − mean)/std), in float64 on the MLP's
    device (with torch: the same function as :meth:`StructuralEquations._mlp`, several times faster on the CPU's cores
    and on a GPU, where it would otherwise be most of a large fit's time after training)."""
    dev = mlp.w1.device
    w1, b1, w2, b2 = (t.detach().to(torch.float64) for t in (mlp.w1, mlp.b1, mlp.w2, mlp.b2))
    mean_t = torch.as_tensor(mean, dtype=torch.float64, device=dev)
    std_t = torch.as_tensor(std, dtype=torch.float64, device=dev)
    h_sum = torch.zeros(X.shape[1], dtype=torch.float64, device=dev)
    h_sq = torch.zeros_like(h_sum)
    step = max(1, ENCODER_BLOCK_ELEMENTS.get(dev.type, 1 << 22) // max(1, w1.numel()))
    with torch.no_grad():
        for s in range(0, X.shape[0], batch):
            rows = X[s:s + batch]
            rows = rows.toarray() if sp.issparse(rows) else np.asarray(rows)
            u = (torch.as_tensor(rows, dtype=torch.float64).to(dev) - mean_t) / std_t
            for b in range(0, u.shape[0], step):
                ub = u[b:b + step]
                h = ub + (torch.nn.functional.silu(torch.addcmul(b1, ub.unsqueeze(-1), w1)) * w2).sum(-1) + b2
                h_sum += h.sum(0)
                h_sq += (h * h).sum(0)
    return h_sum.cpu().numpy(), h_sq.cpu().numpy()


def parents_mlp_equations(model: ParentsMLP, mean: np.ndarray, std: np.ndarray, dag: np.ndarray
                          ) -> StructuralEquations:
    """The structural equations of a fitted :class:`~cape.causal.ParentsMLP` on the thresholded ``dag``.

    Each gene keeps the first-layer weights of its parents in ``dag`` only (those of the edges below τ,
    already small, are dropped with them); ``mean``/``std`` is the standardisation the trainer applied.
    """
    source, target, weight = _edges(dag)
    W = model.masked_weight().detach().double().cpu().numpy()
    params = {"mean": np.asarray(mean, dtype=np.float64), "std": np.asarray(std, dtype=np.float64),
              "edge_w1": W[target, source].reshape(source.size, W.shape[2]),
              **{k: getattr(model, k).detach().double().cpu().numpy() for k in ("b1", "w2", "b2")}}
    return StructuralEquations("parents_mlp", source, target, weight,
                               topological_order(model.n_genes, source, target), params=params)


def linear_equations(X: np.ndarray, dag: np.ndarray, ridge: float = 1e-8) -> StructuralEquations:
    """Refit each gene on its parents in ``dag`` (any nonzero entry i → j) by least squares with an intercept.

    Only the graph's pattern is used; ``ridge`` (relative to each parent's variance) only guards against
    collinear parents.
    """
    X = np.asarray(X, dtype=np.float64)
    source, target, _ = _edges(dag)
    n_genes = X.shape[1]
    order = topological_order(n_genes, source, target)
    mean = X.mean(0)
    intercept = mean.copy()
    weight = np.zeros(source.size)
    Xc = X - mean
    for j in range(n_genes):
        k = np.flatnonzero(target == j)
        if not k.size:
            continue
        P = Xc[:, source[k]]
        gram = P.T @ P
        gram[np.diag_indices_from(gram)] += ridge * np.maximum(np.diag(gram), 1e-12)
        w = np.linalg.solve(gram, P.T @ Xc[:, j])
        weight[k] = w
        intercept[j] = mean[j] - mean[source[k]] @ w
    return StructuralEquations("linear", source, target, weight, order, intercept=intercept)


def intervene(eq: StructuralEquations, X: np.ndarray, do: Mapping[int, float | np.ndarray], *,
              mode: str = "counterfactual", n_cells: int | None = None, seed: int = 0
              ) -> tuple[np.ndarray, np.ndarray]:
    """Cells under do(x_g = v) for every g → v in ``do``, and the matching cells without the intervention.

    Parameters
    ----------
    eq
        The structural equations.
    X
        Observed cells × genes in the equations' units (the cells abduction reads).
    do
        Gene index → value: a scalar, or one value per output cell.
    mode
        ``"counterfactual"``: the observed cells (``n_cells`` of them, drawn without replacement when fewer
        than X's rows, else all), each keeping its abducted exogenous terms; the reference is X itself.
        ``"interventional"``: ``n_cells`` (default: X's rows) new cells from exogenous terms drawn per gene
        from the abducted ones; the reference is generated from the same draws without intervention.
    seed
        Seeds the draws.

    Returns
    -------
    (predicted, reference), both n_cells × genes. Their column means differ only on the intervened genes and
    their descendants.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    X = np.asarray(X, dtype=np.float64)
    n_obs = X.shape[0]
    rng = np.random.default_rng(seed)
    noise = eq.abduct(X)
    parents = eq.parents()
    if mode == "counterfactual":
        if n_cells is not None and n_cells < n_obs:
            rows = np.sort(rng.choice(n_obs, size=n_cells, replace=False))
            X = X[rows]
            noise = {k: v[rows] for k, v in noise.items()}
        values = {int(g): np.broadcast_to(np.asarray(v, dtype=np.float64), X.shape[:1]) for g, v in do.items()}
        return _counterfactual(eq, X, noise, parents, values), X.copy()
    n = n_obs if n_cells is None else int(n_cells)
    draw = rng.integers(0, n_obs, size=(n, eq.n_genes))  # per gene an independent donor cell
    cols = np.arange(eq.n_genes)
    drawn = {k: v[draw, cols] for k, v in noise.items() if k != "F"}
    values = {int(g): np.broadcast_to(np.asarray(v, dtype=np.float64), (n,)) for g, v in do.items()}
    return _generate(eq, drawn, parents, values, n), _generate(eq, drawn, parents, {}, n)


def _counterfactual(eq, X, noise, parents, values) -> np.ndarray:
    if eq.kind == "parents_mlp":
        return _counterfactual_mlp(eq, X, parents, values)
    out = X.copy()
    delta = np.zeros_like(X)  # change of x (linear) or of F (learned), exactly 0 where nothing changes
    for j in eq.order.tolist():
        if j in values:
            out[:, j] = values[j]
            if eq.kind == "linear":
                delta[:, j] = values[j] - X[:, j]
            else:
                delta[:, j] = eq.features(values[j][:, None], np.array([j]))[:, 0] - noise["F"][:, j]
            delta[values[j] == X[:, j], j] = 0.0  # the observed value: nothing changes, exactly
            continue
        pa, w = parents[j]
        if not pa.size or not delta[:, pa].any():
            continue
        delta[:, j] = delta[:, pa] @ w
        if eq.kind == "linear":
            out[:, j] = X[:, j] + delta[:, j]
        else:
            idx = np.array([j])
            F = noise["F"][:, idx]
            out[:, j] = X[:, j] + (eq.decode(F + delta[:, idx], idx) - eq.decode(F, idx))[:, 0]
    return out


def _counterfactual_mlp(eq, X, parents, values) -> np.ndarray:
    """x'_j = x_j + (mean_j(x'_pa) − mean_j(x_pa)): each cell keeps its e_j; untouched genes stay bit-exact."""
    out = X.copy()
    changed = np.zeros(X.shape, dtype=bool)
    for j in eq.order.tolist():
        if j in values:
            out[:, j] = values[j]
            changed[:, j] = values[j] != X[:, j]
            continue
        pa, _ = parents[j]
        rows = changed[:, pa].any(1) if pa.size else np.zeros(X.shape[0], dtype=bool)
        if rows.any():
            out[rows, j] = X[rows, j] + eq.mlp_mean(out[rows], j) - eq.mlp_mean(X[rows], j)
            changed[rows, j] = True
    return out


def _generate(eq, noise, parents, values, n) -> np.ndarray:
    out = np.zeros((n, eq.n_genes))
    latent = np.zeros((n, eq.n_genes))  # x (linear) or F (learned); parents MLP reads ``out``
    for j in eq.order.tolist():
        pa, w = parents[j]
        idx = np.array([j])
        if j in values:
            out[:, j] = values[j]
            latent[:, j] = values[j] if eq.kind != "learned" else eq.features(values[j][:, None], idx)[:, 0]
            continue
        if eq.kind == "parents_mlp":
            out[:, j] = eq.mlp_mean(out, j) + noise["E"][:, j]
            continue
        drive = latent[:, pa] @ w if pa.size else 0.0
        if eq.kind == "linear":
            latent[:, j] = eq.intercept[j] + drive + noise["E"][:, j]
            out[:, j] = latent[:, j]
        else:
            latent[:, j] = drive + noise["Z"][:, j]
            out[:, j] = eq.decode(latent[:, idx], idx)[:, 0] + noise["R"][:, j]
    return out
