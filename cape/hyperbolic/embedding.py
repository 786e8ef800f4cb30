"""Step II core: embed a weighted DAG on the hyperboloid (or in Euclidean space) by Riemannian SGD.

Points live on geoopt's ``Lorentz`` manifold (k = 1, curvature −1) as a ``ManifoldParameter`` in float64
(float32 distances break down a few units from the origin) and are optimised with ``RiemannianSGD``
(exact exponential-map retraction, Eqs. 19–21) or ``RiemannianAdam``. An SGD step moves a point at most
:data:`MAX_STEP`; after every step points are pulled back within ``max_radius`` of the origin and re-projected
exactly onto the hyperboloid, so ⟨p, p⟩_L = −1 holds to float64 rounding (|⟨p,p⟩_L + 1| ≲ 1e-10 at radius 7).

The objective is Eq. 15 (see :mod:`cape.hyperbolic.loss`) with the contrastive term's distances divided by a
temperature τ (:data:`DEFAULT_TEMPERATURE`; τ = 1 is the paper's Eq. 16). τ < 1 sharpens the softmax over
negatives, so a positive keeps being pulled in after it has overtaken the nearest negatives. On 100-node
Barabási–Albert DAGs (seeds 0–4, d = 8) τ = 0.5 gives a MAP over 2-hop neighbours of 0.84 against 0.78 at
τ = 1, with Spearman(π, −‖e‖) ≈ 0.69 in both (``cape-bench embedding``); from d = 3 up it helps, but at
d = 2 it hurts (MAP 0.55 against 0.69 at τ = 1): pass ``temperature=1`` for 2-D embeddings.

Gradients are taken of M·L_H (the sum over nodes rather than the mean) so that the learning rate does not
depend on the number of genes; the recorded loss is the paper's L_H (with τ).

Nodes without any edge (``isolated="negatives"``, the default) still take part: Eq. 16 takes the negatives of
every anchor over all genes, N⁻ = V ∖ N⁺, so an isolated gene is a negative of every other anchor; and as an
anchor it has no positive but itself, at distance 0, whose Eq. 16 term is log(1 + Σ_{n'} e^{−d_mn'}) (weight 1):
it pushes the gene away from every other gene, so no two isolated genes share a position (a graph with no edge
spreads all its genes instead of leaving them at the origin). ``isolated="origin"`` leaves them at the origin
(``embedded`` False). Nodes outside ``nodes=`` never take part and stay at the origin.

Eq. 16 adds one negative log-sum-exp per positive pair, so an anchor is pushed away from its negatives in proportion
to the sum of its positive weights; in d ≥ 3 moving outward lengthens the distance to almost every other point, so
a hub (many positives) is pushed towards the rim while Ω (λ_g·π, with π summing to 1) pulls it back only weakly.
``positive_weights="per_anchor"`` divides each anchor's weights by their sum, which takes that push off hubs.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import geoopt
import numpy as np
import scipy.sparse as sp
import torch

from .._errors import CapeInputError
from .._options import with_options
from .._progress import progress
from .._settings import resolve_device
from .adjacency import as_sparse_adjacency, check_dag
from .embedding_config import DEFAULT_TEMPERATURE as DEFAULT_TEMPERATURE
from .embedding_config import EmbeddingConfig
from .generality import pagerank_generality
from .geometry import GEOMETRIES
from .loss import (
    contrastive_terms,
    generality_regulariser,
    lorentz_sampled_negative_logsumexp,
    negative_logsumexp_exact,
    negative_logsumexp_sampled,
    objective,
    self_pair_terms,
)
from .poincare import lorentz_to_poincare
from .positives import PositivePairs, khop_positives

logger = logging.getLogger("cape")

#: Above this many graph nodes, ``negatives="auto"`` switches from the exact loss to sampled negatives.
AUTO_EXACT_MAX_NODES = 1500
#: Candidate negatives drawn (shared by all anchors) per epoch when sampling. At 2,000 genes, d = 32, 1,000
#: epochs: K = 1,024 took 90 s on one CPU thread with MAP 0.46 / Spearman(π, −‖e‖) 0.60; K = 256 took 27 s but
#: kept MAP 0.40 / Spearman 0.31.
DEFAULT_NEGATIVES = 1024
#: Default learning rates. Large first steps from the origin settle hyperbolic embeddings in worse optima
#: (RSGD lr 0.05 plateaus at a lower MAP than lr 0.02 within 250 epochs and never recovers).
DEFAULT_LR = {("hyperbolic", "rsgd"): 0.02, ("hyperbolic", "radam"): 0.01,
              ("euclidean", "rsgd"): 0.05, ("euclidean", "radam"): 0.01}


#: Poincaré norm below which a gene counts as "at the origin" (its CAPE angles are then all below π/4 · 1e-3).
ORIGIN_TOLERANCE = 1e-3


def fraction_at_origin(poincare: np.ndarray, among: np.ndarray | None = None, tol: float = ORIGIN_TOLERANCE
                       ) -> float:
    """Share of the rows of ``poincare`` (``among``: bool mask, default all) with norm below ``tol``."""
    norms = np.linalg.norm(np.asarray(poincare, dtype=np.float64), axis=1)
    if among is not None:
        norms = norms[np.asarray(among, dtype=bool)]
    return float((norms < tol).mean()) if norms.size else 0.0


@dataclass
class EmbeddingResult:
    """Output of :func:`embed_dag` (NumPy, float64).

    Attributes
    ----------
    points
        (M, d+1) hyperboloid points, or (M, d) Euclidean points for ``geometry="euclidean"``.
    poincare
        (M, d) positions in the open unit ball: Eq. A.22 of ``points`` (hyperbolic), or the Euclidean points
        scaled uniformly into the ball (ablation).
    generality
        (M,) PageRank generality π (Eq. 18), sums to 1.
    embedded
        (M,) bool, node took part in the optimisation (others sit at the origin).
    connected
        (M,) bool, node has at least one edge.
    losses
        L_H after each epoch.
    seconds, cpu_seconds
        Wall-clock time and CPU time of this process (all threads) for the whole call.
    """

    points: np.ndarray
    poincare: np.ndarray
    generality: np.ndarray
    embedded: np.ndarray
    connected: np.ndarray
    losses: np.ndarray
    geometry: str
    negatives: int | None
    n_positive_pairs: int
    seconds: float
    cpu_seconds: float = float("nan")
    params: dict = field(default_factory=dict)

    def fraction_at_origin(self, among: np.ndarray | None = None, tol: float = ORIGIN_TOLERANCE) -> float:
        """Share of the nodes (``among``: a bool mask, default all) whose Poincaré position lies within ``tol`` of
        the origin: genes that a rotary encoding leaves (nearly) unrotated, indistinguishable from one another."""
        return fraction_at_origin(self.poincare, among, tol)



def _embedded_nodes(matrix: sp.csr_matrix, isolated: str, nodes) -> tuple[np.ndarray, np.ndarray]:
    """(connected, embedded): the nodes with an edge, and those that take part in the optimisation."""
    n_total = matrix.shape[0]
    degree = np.asarray((matrix != 0).sum(axis=0)).ravel() + np.asarray((matrix != 0).sum(axis=1)).ravel()
    connected = degree > 0
    if isolated == "origin":
        return connected, connected.copy()
    if nodes is None:
        return connected, np.ones(n_total, dtype=bool)
    mask = np.asarray(nodes, dtype=bool).ravel()
    if mask.shape != (n_total,):
        raise CapeInputError(f"nodes must be a bool mask of length {n_total}, got shape {mask.shape}")
    return connected, mask | connected


def _to_ball(points: np.ndarray, geometry: str) -> np.ndarray:
    """Poincaré-ball positions: Eq. A.22 (hyperbolic), or the Euclidean points scaled uniformly into the ball."""
    if geometry == "hyperbolic":
        return lorentz_to_poincare(torch.from_numpy(points)).numpy()
    radius = np.linalg.norm(points, axis=1).max() if points.shape[0] else 0.0
    return points / (radius * (1.0 + 1e-6)) if radius > 0 else points.copy()


def embed_dag(adjacency, config: EmbeddingConfig | None = None, *, device: str | None = "auto", seed: int = 0,
              names=None, nodes=None, show_progress: bool = True, **options) -> EmbeddingResult:
    """Embed a weighted DAG (Step II).

    Parameters
    ----------
    adjacency
        M×M weighted adjacency (dense, sparse or DataFrame), ``A[i, j] != 0`` meaning i → j. Must be acyclic
        without self-loops.
    config
        Step II's options (:class:`~cape.hyperbolic.EmbeddingConfig`: ``dim``, ``k_hop``, ``lambda_g``, ``restart``,
        ``epochs``, ``lr``, ``optimizer``, ``geometry``, ``negatives``, ``max_radius``, ``init_scale``,
        ``temperature``, ``isolated``, ``positive_weights``); default: the paper's (d 32, 2-hop positives, λ_g 0.1,
        restart 0.15, 1,000 epochs of Riemannian SGD) with τ = :data:`DEFAULT_TEMPERATURE`.
    device
        ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``.
    seed
        Seeds the initialisation and negative sampling.
    names
        Gene names, used in error messages.
    nodes
        Optional (M,) bool mask of the nodes that may take part (e.g. the genes Step I used); others stay at the
        origin. Nodes with an edge always take part.
    show_progress
        Show a progress bar.
    **options
        Fields of :class:`~cape.hyperbolic.EmbeddingConfig` by name (e.g. ``dim=8, epochs=200``), replacing those
        of ``config``; another name raises :class:`~cape.CapeInputError`.

    Returns
    -------
    EmbeddingResult
    """
    start, cpu_start = time.perf_counter(), time.process_time()
    config = with_options(EmbeddingConfig, config, options, "embed_dag")
    dim, epochs, geometry = int(config.dim), int(config.epochs), config.geometry
    matrix = as_sparse_adjacency(adjacency)
    check_dag(matrix, names)
    generality = pagerank_generality(matrix, restart=config.restart)
    connected, embedded = _embedded_nodes(matrix, config.isolated, nodes)
    nodes = np.flatnonzero(embedded)
    points = np.zeros((matrix.shape[0], dim + 1 if geometry == "hyperbolic" else dim))
    if geometry == "hyperbolic":
        points[:, 0] = 1.0
    pairs = khop_positives(sp.csr_matrix(matrix[nodes][:, nodes]), config.k_hop) if nodes.size else None
    if pairs is not None and config.positive_weights == "per_anchor":
        pairs = pairs.per_anchor()
    n_sampled = _resolve_negatives(config.negatives, nodes.size)
    lr = DEFAULT_LR[(geometry, config.optimizer)] if config.lr is None else float(config.lr)
    params = {"dim": dim, "k_hop": int(config.k_hop), "lambda_g": float(config.lambda_g),
              "restart": float(config.restart), "epochs": epochs, "lr": lr, "optimizer": config.optimizer,
              "geometry": geometry, "negatives": n_sampled, "max_radius": float(config.max_radius),
              "init_scale": float(config.init_scale), "temperature": float(config.temperature), "seed": int(seed),
              "positive_weight": "strongest_path_product" + ("/anchor_sum" if config.positive_weights == "per_anchor"
                                                             else ""),
              "isolated": config.isolated}
    if not connected.any():
        logger.warning("the graph has no edges: %s", "every gene is placed at the origin" if config.isolated == "origin"
                       else "genes are only spread apart (Step II's negatives), their positions carry no causal "
                            "information")
    losses = np.zeros(0)
    if nodes.size:
        dev = resolve_device(device)
        params["device"] = str(dev)
        points[nodes], losses = _optimise(pairs, generality[nodes], config, lr=lr, n_sampled=n_sampled, device=dev,
                                          seed=int(seed), show_progress=show_progress)
    return EmbeddingResult(points=points, poincare=_to_ball(points, geometry), generality=generality,
                           embedded=embedded, connected=connected, losses=np.asarray(losses, dtype=np.float64),
                           geometry=geometry, negatives=n_sampled,
                           n_positive_pairs=len(pairs) if pairs is not None else 0,
                           seconds=time.perf_counter() - start, cpu_seconds=time.process_time() - cpu_start,
                           params=params)


#: Longest move (in distance units) a point may make in one SGD step; hubs sum many pulls, and an
#: unbounded exponential-map step overflows cosh.
MAX_STEP = 1.0


@torch.no_grad()
def _limit_step_(param: torch.Tensor, lr: float, geometry: str) -> None:
    """Scale each point's gradient so that lr·‖Riemannian gradient‖ ≤ :data:`MAX_STEP` (in place)."""
    grad = param.grad
    if geometry == "hyperbolic":
        rgrad = grad.clone()
        rgrad[:, 0].neg_()  # g_l⁻¹ ∇ (Eq. 19), then the tangent projection u + ⟨p, u⟩_L p (Eq. 20)
        inner = (param[:, 1:] * rgrad[:, 1:]).sum(-1) - param[:, 0] * rgrad[:, 0]
        rgrad += inner[:, None] * param
        sq = (rgrad[:, 1:] ** 2).sum(-1) - rgrad[:, 0] ** 2
    else:
        sq = (grad**2).sum(-1)
    norm = torch.sqrt(sq.clamp_min(0.0))
    scale = (MAX_STEP / (lr * norm).clamp_min(1e-300)).clamp_max(1.0)
    grad.mul_(scale[:, None])


def _resolve_negatives(negatives, n_nodes: int) -> int | None:
    if negatives is None:
        return None
    if negatives == "auto":
        return None if n_nodes <= AUTO_EXACT_MAX_NODES else DEFAULT_NEGATIVES
    return int(negatives)


def _valid_negatives(sample: torch.Tensor, slot: torch.Tensor, columns: torch.Tensor, rows: torch.Tensor,
                     cols: torch.Tensor, m: int) -> torch.Tensor:
    """(M, K) bool: sampled node k is a negative of anchor m (neither m itself nor one of its positives).

    Marks the P positive pairs whose partner was drawn (a scatter over P, not a search over M·K);
    ``slot`` is a scratch (M,) buffer of −1 that is restored before returning.
    """
    valid = torch.ones(m, sample.numel(), dtype=torch.bool, device=sample.device)
    slot[sample] = columns
    hit = slot[cols]
    drawn = hit >= 0
    valid[rows[drawn], hit[drawn]] = False
    valid[sample, columns] = False
    slot[sample] = -1
    return valid


def _optimise(pairs: PositivePairs, generality: np.ndarray, config: EmbeddingConfig, *, lr: float,
              n_sampled: int | None, device: torch.device, seed: int, show_progress: bool
              ) -> tuple[np.ndarray, list[float]]:
    """The points of the ``pairs.n_nodes`` embedded nodes after ``config.epochs`` steps, and the loss per epoch."""
    geom, dim, optimizer = GEOMETRIES[config.geometry], int(config.dim), config.optimizer
    temperature, init_scale, dtype, m = float(config.temperature), config.init_scale, torch.float64, pairs.n_nodes
    init_gen = torch.Generator().manual_seed(seed)
    spatial = torch.randn(m, dim, generator=init_gen, dtype=dtype) * init_scale
    rows = torch.as_tensor(pairs.rows, device=device)
    cols = torch.as_tensor(pairs.cols, device=device)
    weights = torch.as_tensor(pairs.weights, dtype=dtype, device=device)
    pi = torch.as_tensor(generality, dtype=dtype, device=device)
    lone = torch.as_tensor(pairs.counts() == 0, device=device)  # anchors without positives: self-pair term

    if geom.name == "hyperbolic":
        manifold = geoopt.Lorentz(k=torch.tensor(1.0, dtype=dtype))
        x0 = torch.sqrt(1.0 + (spatial * spatial).sum(-1, keepdim=True))
        param = geoopt.ManifoldParameter(torch.cat([x0, spatial], -1).to(device), manifold=manifold)
        manifold.to(device)
        opt_cls = geoopt.optim.RiemannianSGD if optimizer == "rsgd" else geoopt.optim.RiemannianAdam
    else:
        param = torch.nn.Parameter(spatial.to(device))
        opt_cls = torch.optim.SGD if optimizer == "rsgd" else torch.optim.Adam
    opt = opt_cls([param], lr=lr)

    if n_sampled is None:
        positive_mask = torch.zeros(m, m, dtype=torch.bool, device=device)
        positive_mask[rows, cols] = True
    else:
        # Each unordered pair appears twice (once per anchor): compute its distance once.
        lo, hi = np.minimum(pairs.rows, pairs.cols), np.maximum(pairs.rows, pairs.cols)
        undirected, pair_index = np.unique(lo * m + hi, return_inverse=True)
        u_rows = torch.as_tensor(undirected // m, device=device)
        u_cols = torch.as_tensor(undirected % m, device=device)
        pair_index = torch.as_tensor(pair_index.ravel(), device=device)
        n_negatives = (m - 1) - torch.bincount(rows, minlength=m)
        sample_gen = torch.Generator(device=device).manual_seed(seed + 1)
        # slot[node] = its column in this epoch's sample, −1 when not drawn
        slot = torch.full((m,), -1, dtype=torch.long, device=device)
        columns = torch.arange(min(n_sampled, m), device=device)  # K ≥ M draws every node

    losses: list[float] = []
    epochs = int(config.epochs)
    bar = progress(range(epochs), desc=f"Step II ({geom.name})", total=epochs) if show_progress \
        else range(epochs)
    for epoch in bar:
        opt.zero_grad(set_to_none=True)
        if n_sampled is None:
            dist = geom.dist_matrix(param, param) / temperature
            pos_dist = dist[rows, cols]
            neg_lse = negative_logsumexp_exact(dist, positive_mask.clone())
        else:
            # index_select: its backward is index_add, much faster on CPU than advanced indexing's index_put.
            pos_dist = geom.dist(param.index_select(0, u_rows), param.index_select(0, u_cols))[pair_index]
            pos_dist = pos_dist / temperature
            # One set of K candidates per epoch shared by every anchor: an (M, K) distance matrix by matmul.
            sample = torch.randperm(m, generator=sample_gen, device=device)[:n_sampled]
            valid = _valid_negatives(sample, slot, columns, rows, cols, m)
            if geom.name == "hyperbolic":
                neg_lse = lorentz_sampled_negative_logsumexp(param, param.index_select(0, sample), valid,
                                                             n_negatives, temperature)
            else:
                neg_dist = geom.dist_matrix(param, param.index_select(0, sample)) / temperature
                neg_lse = negative_logsumexp_sampled(neg_dist, valid, n_negatives)
        contrastive = contrastive_terms(pos_dist, rows, weights, neg_lse, m) + self_pair_terms(neg_lse, lone)
        regulariser = generality_regulariser(geom.dist0(param), pi)
        loss = objective(contrastive, regulariser, config.lambda_g)
        (loss * m).backward()
        if optimizer == "rsgd":
            _limit_step_(param, lr, geom.name)
        opt.step()
        geom.clip_radius_(param.data, config.max_radius)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(f"Step II loss became {value} at epoch {epoch}")
        losses.append(value)
        if show_progress and epoch % 50 == 0 and hasattr(bar, "set_postfix"):
            bar.set_postfix(loss=f"{value:.4g}")
    return param.detach().cpu().numpy().astype(np.float64), losses
