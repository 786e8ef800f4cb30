"""Options of Step II (:class:`EmbeddingConfig`), shared by :func:`~cape.hyperbolic.embed_dag`,
:func:`cape.tl.hyperbolic_embedding`, ``cape embed`` and the workflow's ``embed:`` section (its keys are the fields)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

from .._errors import CapeInputError
from .geometry import GEOMETRIES

__all__ = ["DEFAULT_TEMPERATURE", "ISOLATED", "OPTIMIZERS", "POSITIVE_WEIGHTS", "EmbeddingConfig"]

#: Distances in the contrastive term are divided by this (τ; the paper's Eq. 16 has τ = 1).
DEFAULT_TEMPERATURE = 0.5
#: ``optimizer`` values: Riemannian SGD (plain SGD for Euclidean) or Riemannian Adam (Adam).
OPTIMIZERS = ("rsgd", "radam")
#: ``isolated`` values: genes without an edge as negatives of every anchor, or left at the origin.
ISOLATED = ("negatives", "origin")
#: ``positive_weights`` values: Eq. 16's weights as they are, or divided by each anchor's sum.
POSITIVE_WEIGHTS = ("path", "per_anchor")


def _is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class EmbeddingConfig:
    """Step II's options: the space, the loss and the optimiser.

    Attributes
    ----------
    dim
        Dimension d of the hyperbolic space (points have d+1 coordinates), ≥ 2; the paper uses d = D/2 of the
        transformer width.
    k_hop
        Positives are nodes joined by a directed path of at most ``k_hop`` edges (Eq. 16), weighted by the strongest
        path product (:mod:`cape.hyperbolic.positives`).
    lambda_g
        Weight λ_g of the generality regulariser (Eq. 15).
    restart
        PageRank restart weight w (Eq. 18), in (0, 1).
    epochs
        Full-batch optimisation steps.
    lr
        Learning rate; ``None``: by geometry and optimiser (:data:`cape.hyperbolic.embedding.DEFAULT_LR`).
    optimizer
        ``"rsgd"`` (geoopt RiemannianSGD; plain SGD for Euclidean) or ``"radam"`` (RiemannianAdam / Adam).
    geometry
        ``"hyperbolic"`` or ``"euclidean"`` (the CAPE-w/o-hyperbolic ablation).
    negatives
        ``None``: the exact loss (all non-positives); an int K: each epoch draws K distinct nodes shared by all anchors,
        scaled to estimate the full sum; ``"auto"``: exact up to 1,500 graph nodes, else 1,024 sampled.
    max_radius
        Largest distance from the origin a point may reach (float64 stays exact well beyond 7).
    init_scale
        Standard deviation of the initial spatial coordinates around the origin.
    temperature
        τ > 0: the contrastive term (Eq. 16) uses d / τ (1 is the paper's form; use 1 for d = 2); ``None`` stands for
        :data:`DEFAULT_TEMPERATURE`.
    isolated
        ``"negatives"`` (default): nodes without an edge take part as negatives of every anchor (Eq. 16's
        N⁻ = V ∖ N⁺) and as anchors of their self-pair term, which spreads them apart; ``"origin"``: they stay at the
        origin, where a rotary encoding leaves them unrotated and indistinguishable.
    positive_weights
        ``"path"`` (default, Eq. 16): each positive pair weighs its strongest path product, so an anchor's pull from
        its negatives is summed once per positive and a hub, with many positives, is pushed outward the hardest;
        ``"per_anchor"``: each anchor's weights are divided by their sum, so every anchor is pushed by its negatives
        as hard as any other and hubs are no longer pushed towards the rim (see ``docs/benchmarks/step2_embedding.md``).
    """

    dim: int = 32
    k_hop: int = 2
    lambda_g: float = 0.1
    restart: float = 0.15
    epochs: int = 1000
    lr: float | None = None
    optimizer: str = "rsgd"
    geometry: str = "hyperbolic"
    negatives: int | str | None = "auto"
    max_radius: float = 7.0
    init_scale: float = 1e-3
    temperature: float = DEFAULT_TEMPERATURE
    isolated: str = "negatives"
    positive_weights: str = "path"

    def __post_init__(self) -> None:
        if self.temperature is None:
            object.__setattr__(self, "temperature", DEFAULT_TEMPERATURE)
        if not (_is_number(self.dim) and int(self.dim) == self.dim and self.dim >= 2):
            raise CapeInputError(f"dim must be an integer ≥ 2, got {self.dim!r}")
        if not (_is_int(self.k_hop) and self.k_hop >= 1):
            raise CapeInputError(f"k_hop must be a positive integer, got {self.k_hop!r}")
        if not (_is_number(self.lambda_g) and self.lambda_g >= 0):
            raise CapeInputError(f"lambda_g must be ≥ 0, got {self.lambda_g!r}")
        if not (_is_number(self.restart) and 0 < self.restart < 1):
            raise CapeInputError(f"restart must be in (0, 1), got {self.restart!r}")
        if not (_is_number(self.epochs) and int(self.epochs) == self.epochs and self.epochs >= 0):
            raise CapeInputError(f"epochs must be a non-negative integer, got {self.epochs!r}")
        if self.lr is not None and not (_is_number(self.lr) and self.lr > 0):
            raise CapeInputError(f"lr must be > 0 (or None: the optimizer's default), got {self.lr!r}")
        if self.optimizer not in OPTIMIZERS:
            raise CapeInputError(f"optimizer must be 'rsgd' or 'radam', got {self.optimizer!r}")
        if self.geometry not in GEOMETRIES:
            raise CapeInputError(f"geometry must be 'hyperbolic' or 'euclidean', got {self.geometry!r}")
        if not (self.negatives is None or self.negatives == "auto"
                or (_is_number(self.negatives) and int(self.negatives) == self.negatives and self.negatives >= 1)):
            raise CapeInputError(f"negatives must be None, 'auto' or a positive integer, got {self.negatives!r}")
        if not (_is_number(self.max_radius) and self.max_radius > 0):
            raise CapeInputError(f"max_radius must be > 0, got {self.max_radius!r}")
        if not (_is_number(self.init_scale) and self.init_scale >= 0):
            raise CapeInputError(f"init_scale must be ≥ 0, got {self.init_scale!r}")
        if not (_is_number(self.temperature) and self.temperature > 0):
            raise CapeInputError(f"temperature must be a finite number > 0, got {self.temperature!r}")
        if self.isolated not in ISOLATED:
            raise CapeInputError(f"isolated must be 'negatives' or 'origin', got {self.isolated!r}")
        if self.positive_weights not in POSITIVE_WEIGHTS:
            raise CapeInputError(f"positive_weights must be 'path' or 'per_anchor', got {self.positive_weights!r}")
