"""The Step II objective (Eqs. 15–17): weighted contrastive term over k-hop positives plus the generality
regulariser, in an exact form (all other nodes are negatives) and a negative-sampled form for large M.

Distances come from :mod:`cape.hyperbolic.geometry`; these functions only see distance tensors, so the same
loss drives the hyperbolic embedding and its Euclidean ablation.

For anchor m with positives N⁺(m) and negatives N⁻(m) = V \\ (N⁺(m) ∪ {m}) (self-pairs are excluded: the
gradient of d(p, p) is meaningless), Eq. 16 reads

    L_con(m) = Σ_{n ∈ N⁺(m)} w_mn · [ d_mn + log( e^{−d_mn} + Σ_{n' ∈ N⁻(m)} e^{−d_mn'} ) ],

computed with log-sum-exp. The sampled form replaces the negative sum by (|N⁻(m)| / K') Σ over the K' valid
draws among K uniform samples (a draw that hits m or a positive is discarded), an unbiased estimate of the
sum inside the logarithm. (:func:`cape.hyperbolic.embed_dag` draws one set of K candidates per epoch,
shared by all anchors, so the negative distances form an M×K matrix computed by one matrix product;
:func:`lorentz_sampled_negative_logsumexp` fuses that product, the distance and the masked log-sum-exp into
one autograd node for the hyperboloid, which keeps the M×K work to a few passes.)

All functions take distances already divided by the temperature τ of :func:`cape.hyperbolic.embed_dag`
(the paper's Eq. 16 is τ = 1).
"""

from __future__ import annotations

import torch

from .geometry import _ACOSH_FLOOR

# A finite stand-in for log(0) = −inf: keeps log-sum-exp gradients finite for anchors without negatives.
_LOG_ZERO = -1e30


def contrastive_terms(pos_dist: torch.Tensor, pos_anchor: torch.Tensor, pos_weight: torch.Tensor,
                      neg_logsumexp: torch.Tensor, n_nodes: int) -> torch.Tensor:
    """Per-anchor contrastive loss L_con (Eq. 16) from positive distances and each anchor's
    ``log Σ_{n'∈N⁻} exp(−d)``.

    Parameters
    ----------
    pos_dist, pos_anchor, pos_weight
        Distance, anchor index and weight of each positive pair, shape (P,).
    neg_logsumexp
        Shape (M,): log of the (estimated) negative sum of each anchor; ``_LOG_ZERO`` when it has none.
    n_nodes
        M.

    Returns
    -------
    torch.Tensor
        Shape (M,), zero for anchors without positives.
    """
    terms = pos_dist + torch.logaddexp(-pos_dist, neg_logsumexp[pos_anchor])
    out = torch.zeros(n_nodes, dtype=pos_dist.dtype, device=pos_dist.device)
    return out.index_add(0, pos_anchor, pos_weight * terms)


def self_pair_terms(neg_logsumexp: torch.Tensor, lone: torch.Tensor) -> torch.Tensor:
    """Eq. 16 term of anchors whose only positive is themselves (genes without an edge), at distance 0:
    ``log(1 + Σ_{n'∈N⁻(m)} exp(−d_mn'))`` where ``lone`` is True, else 0; shape (M,).

    It pushes such a gene away from every other gene and is bounded below by 0, so isolated genes spread out
    instead of collapsing onto one point (see :mod:`cape.hyperbolic.embedding`).
    """
    return torch.where(lone, torch.nn.functional.softplus(neg_logsumexp), torch.zeros((), dtype=neg_logsumexp.dtype))


def negative_logsumexp_exact(dist: torch.Tensor, positive_mask: torch.Tensor) -> torch.Tensor:
    """``log Σ_{n'∈N⁻(m)} exp(−d_mn')`` for every anchor from the full M×M distance matrix."""
    neg_mask = ~positive_mask
    neg_mask.fill_diagonal_(False)
    masked = torch.where(neg_mask, -dist, _LOG_ZERO)
    lse = torch.logsumexp(masked, dim=1)
    return torch.where(neg_mask.any(dim=1), lse, _LOG_ZERO)


def negative_logsumexp_sampled(neg_dist: torch.Tensor, valid: torch.Tensor,
                               n_negatives: torch.Tensor) -> torch.Tensor:
    """Estimated ``log Σ_{n'∈N⁻(m)} exp(−d_mn')`` from K samples per anchor.

    Parameters
    ----------
    neg_dist
        (M, K) distances from each anchor to the sampled nodes.
    valid
        (M, K) bool: the sample is a true negative (not the anchor, not a positive).
    n_negatives
        (M,) |N⁻(m)|, the number of negatives each anchor has in the full graph.
    """
    masked = torch.where(valid, -neg_dist, _LOG_ZERO)
    n_valid = valid.sum(dim=1)
    lse = torch.logsumexp(masked, dim=1)
    scale = torch.log(n_negatives.to(neg_dist.dtype).clamp_min(1.0)) - torch.log(
        n_valid.to(neg_dist.dtype).clamp_min(1.0))
    usable = (n_valid > 0) & (n_negatives > 0)
    return torch.where(usable, lse + scale, _LOG_ZERO)


class _LorentzSampledNegativeLSE(torch.autograd.Function):
    """Forward: ``lse_m = log Σ_k valid_mk exp(−arcosh(−⟨x_m, y_k⟩_L) / τ) + log_scale_m``; backward by hand.

    d lse_m / d u_mk = −softmax_mk / (τ √(u_mk² − 1)) with u = −⟨x, y⟩_L, and u = (x ⊙ s) yᵀ with
    s = (1, −1, …, −1), so the gradients are two (M, K) × (K, d+1) products. Where u is clamped at its floor
    (coincident points) the distance is treated as constant, as in :class:`LorentzGeometry`.
    """

    @staticmethod
    def forward(ctx, x, y, valid, log_scale, temperature: float):
        sign = torch.full((x.shape[-1],), -1.0, dtype=x.dtype, device=x.device)
        sign[0] = 1.0
        u = (x * sign) @ y.T
        floor = u <= _ACOSH_FLOOR
        u.clamp_(min=_ACOSH_FLOOR)
        logits = torch.acosh(u).div_(-temperature).masked_fill_(~valid, float("-inf"))
        lse = torch.logsumexp(logits, dim=1)
        has = torch.isfinite(lse)
        # softmax weights; rows without any valid sample get weight 0 everywhere
        weights = logits.sub_(torch.where(has, lse, 0.0)[:, None]).exp_()
        # d/du arcosh(u) = 1 / √(u² − 1); zero at the floor
        inv = u.mul_(u).sub_(1.0).clamp_(min=1e-300).rsqrt_().masked_fill_(floor, 0.0)
        ctx.save_for_backward(x, y, weights.mul_(inv), sign)
        ctx.temperature = temperature
        return torch.where(has, lse + log_scale, _LOG_ZERO)

    @staticmethod
    def backward(ctx, grad):
        x, y, coef, sign = ctx.saved_tensors
        # d out_m / d u_mk = −coef_mk / τ (rows without samples have coef 0)
        c = coef * (grad / -ctx.temperature)[:, None]
        grad_x = (c @ y) * sign if ctx.needs_input_grad[0] else None
        grad_y = (c.T @ x) * sign if ctx.needs_input_grad[1] else None
        return grad_x, grad_y, None, None, None


def lorentz_sampled_negative_logsumexp(x: torch.Tensor, y: torch.Tensor, valid: torch.Tensor,
                                       n_negatives: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """:func:`negative_logsumexp_sampled` of the hyperboloid distances d(x_m, y_k) / τ, fused.

    Parameters
    ----------
    x
        (M, d+1) anchors on the hyperboloid.
    y
        (K, d+1) sampled nodes.
    valid
        (M, K) bool: the sample is a true negative of the anchor.
    n_negatives
        (M,) |N⁻(m)|.
    temperature
        τ > 0; distances are divided by it.

    Returns
    -------
    torch.Tensor
        (M,), equal to ``negative_logsumexp_sampled(LorentzGeometry.dist_matrix(x, y) / τ, valid, n_negatives)``
        (``_LOG_ZERO`` for anchors without a valid sample or without negatives).
    """
    n_valid = valid.sum(dim=1)
    log_scale = torch.log(n_negatives.to(x.dtype).clamp_min(1.0)) - torch.log(n_valid.to(x.dtype).clamp_min(1.0))
    return _LorentzSampledNegativeLSE.apply(x, y, valid & (n_negatives > 0)[:, None], log_scale,
                                            float(temperature))


def generality_regulariser(dist_to_origin: torch.Tensor, generality: torch.Tensor) -> torch.Tensor:
    """Ω(p_m) = π_m · d(p_m, origin) (Eq. 17), per node."""
    return generality * dist_to_origin


def objective(contrastive: torch.Tensor, regulariser: torch.Tensor, lambda_g: float) -> torch.Tensor:
    """L_H = (1/M) Σ_m [L_con(m) + λ_g Ω(m)] (Eq. 15)."""
    return (contrastive + lambda_g * regulariser).mean()
