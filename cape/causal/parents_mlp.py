"""Step I with nonlinear parents: each gene an MLP of all its candidate parents (``model="parents_mlp"``).

The paper's variational NOTEARS (:mod:`cape.causal.model`) is linear in a learnt per-gene feature space,
F_j = Σ_i A_ij F_i + Z_j: a gene's parents enter through one weighted sum, so it cannot express parents that
act together (a sigmoid of a sum of parents, an AND of two regulators). On data from an MLP SEM it scores
about what it scores with its MLPs switched off (``cape-bench causal --diagnose``). This model fits the
structural equations directly, as SDCD does (Nazaret et al., ICML 2024):

    x_j = g_j(x) + e_j,   g_j(x) = b2_j + Σ_k w2_jk·sigmoid(Σ_i W_jik·x_i + b1_jk),   e_j ~ N(0, s_j²),

on standardised genes, with W_jjk = 0. The weighted adjacency is the size of each parent's first-layer
weights, A_ij = ‖W_ji·‖₂ (gene i → gene j), so A_ij = 0 exactly when g_j ignores x_i, and the NOTEARS
penalty h(A) = tr(exp(A∘A)) − M is zero exactly when the genes' equations form a DAG.

Loss per step, on a minibatch: the Gaussian negative log-likelihood with each gene's variance s_j² profiled
out, ½ Σ_j log mean_b (x_bj − g_j(x_b))², plus λ‖A‖₁ + β‖W‖² (+ γ·h(A) in stage 2). The profiled variance
makes the score invariant to each gene's scale and weighs each gene's residual by its own noise level, as the
likelihood of an SEM with unequal noise variances does, where NOTEARS' shared least squares weighs every
residual alike (docs/benchmarks/step1_sdcd.md measures what that changes). Fitting proceeds in SDCD's two stages:

1. screening: no acyclicity, L1 ``lambda_screen``; the candidate parents of each gene are the edges with
   A_ij above ``screen_fraction`` times the largest A;
2. the same network, restricted to the candidates, with γ·h(A) added and γ raised by ``gamma_step`` every
   step (a penalty that grows until the cycles give way, instead of an augmented Lagrangian's inner
   solves), L1 ``lambda_sparse``.

Thresholding at τ and cycle breaking (:func:`cape.causal.make_dag`) then guarantee the DAG, as for the
default model. Cost: the first layer holds M²·hidden weights and each step costs O(batch·M²·hidden) plus
an M×M matrix exponential, so the model is meant for gene panels (up to :data:`MAX_GENES`); the default
low-rank model is the one that scales to whole transcriptomes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from .._errors import CapeInputError
from .._options import with_options
from .._progress import progress
from .._settings import resolve_device
from .acyclicity_penalty import acyclicity_dense
from .causal_config import _is_int, _is_number
from .trainer import (
    COLLAPSE_CHECK_CELLS,
    CausalFit,
    _flushing_denormals,
    collapse_reason,
    gene_moments,
    intervention_rows,
    max_correlation,
    near_empty,
)

__all__ = ["H_LINEAR_MAX", "LAMBDA_SCREEN", "LAMBDA_SPARSE", "MAX_GENES", "ParentsMLP", "ParentsMLPConfig",
           "bounded_acyclicity",
           "fit_parents_mlp", "min_cells", "profiled_gaussian_nll"]

logger = logging.getLogger("cape")

#: Most genes :func:`fit_parents_mlp` accepts: M²·hidden first-layer weights and an M×M exponential per step.
MAX_GENES = 1000
#: Above this value the acyclicity penalty grows like log h instead of h (see :func:`bounded_acyclicity`).
H_LINEAR_MAX = 1e6
#: Default L1 prices of the screening and the constrained stage (per unit of A on standardised genes).
LAMBDA_SCREEN = 1e-3
LAMBDA_SPARSE = 1e-3


@dataclass(frozen=True)
class ParentsMLPConfig:
    """Options of :func:`fit_parents_mlp`: the network, the two stages' L1 prices, Adam and the screening.

    Attributes
    ----------
    hidden
        Hidden units per gene's MLP.
    lambda_screen, lambda_sparse
        L1 price of ‖A‖₁ in the screening stage and in the constrained stage.
    l2
        β of the squared-weight penalty on every weight (both stages).
    screen_steps, steps
        Adam steps of the screening stage and of the constrained stage (each a minibatch of ``batch_size``
        cells drawn with replacement, so the cost does not grow with the number of cells).
    screen_lr, lr
        Adam learning rates of the two stages; at lower rates the fixed step budget leaves the fit short of
        convergence (docs/benchmarks/step1_sdcd.md).
    batch_size
        Cells per step (at most the number of cells).
    screen_fraction
        A candidate parent needs A_ij > ``screen_fraction`` · max A after screening.
    gamma_step
        Growth of the acyclicity penalty's coefficient γ per constrained step (γ starts at 0).
    """

    hidden: int = 10
    lambda_screen: float = LAMBDA_SCREEN
    lambda_sparse: float = LAMBDA_SPARSE
    l2: float = 5e-3
    screen_steps: int = 3000
    steps: int = 6000
    screen_lr: float = 1.5e-2
    lr: float = 6e-3
    batch_size: int = 512
    screen_fraction: float = 0.2
    gamma_step: float = 5e-3

    def __post_init__(self) -> None:
        checks = [(("hidden", "batch_size"), lambda v: _is_int(v) and v >= 1, "a positive integer"),
                  (("screen_steps", "steps"), lambda v: _is_int(v) and v >= 0, "a whole number ≥ 0"),
                  (("lambda_screen", "lambda_sparse", "l2", "gamma_step", "screen_fraction"),
                   lambda v: _is_number(v) and v >= 0, "a finite number ≥ 0"),
                  (("screen_lr", "lr"), lambda v: _is_number(v) and v > 0, "> 0")]
        for names, valid, what in checks:
            for name in names:
                if not valid(getattr(self, name)):
                    raise CapeInputError(f"{name} must be {what}, got {getattr(self, name)!r}")


def min_cells(n_genes: int, hidden: int = 10) -> int:
    """Fewest cells :func:`fit_parents_mlp` accepts: one per first-layer weight of a gene's MLP, (M − 1)·hidden.

    Below it each gene's MLP can fit the cells' noise, and the profiled likelihood, which rewards a residual
    variance falling towards 0 without bound, pays for that more than the L1 price of any edge: on 693 cells
    × 300 genes every gene kept about 130 candidate parents and the graph was a dense tangle.
    """
    return (int(n_genes) - 1) * int(hidden)


class ParentsMLP(nn.Module):
    """M one-hidden-layer MLPs, gene j's reading every other gene: g_j(x) = b2_j + w2_j·sigmoid(W_j x + b1_j).

    ``weight`` is the first layer, indexed (target gene j, parent gene i, hidden unit k); ``mask`` (i → j,
    a buffer) restricts the candidate parents (the diagonal is always masked).
    """

    def __init__(self, n_genes: int, hidden: int = 10, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if hidden < 1:
            raise ValueError(f"hidden must be at least 1, got {hidden}")
        # float32 whatever torch's default dtype (importing gcastle's algorithms sets it to float64)
        f32 = torch.float32
        self.weight = nn.Parameter(0.1 * torch.randn(n_genes, n_genes, hidden, generator=generator, dtype=f32))
        self.b1 = nn.Parameter(torch.zeros(n_genes, hidden, dtype=f32))
        self.w2 = nn.Parameter(0.1 * torch.randn(n_genes, hidden, generator=generator, dtype=f32))
        self.b2 = nn.Parameter(torch.zeros(n_genes, dtype=f32))
        self.register_buffer("mask", 1.0 - torch.eye(n_genes, dtype=f32))

    @property
    def n_genes(self) -> int:
        return int(self.weight.shape[0])

    def masked_weight(self) -> torch.Tensor:
        """First-layer weights with the non-candidate parents (and self-loops) zeroed."""
        return self.weight * self.mask.T.unsqueeze(-1)

    def adjacency(self) -> torch.Tensor:
        """A_ij = ‖W_ji·‖₂ (i → j), differentiable; exactly 0 on masked entries."""
        squared = self.masked_weight().pow(2).sum(-1).T
        # sqrt's gradient is infinite at 0; where an entry is masked the value is an exact 0 anyway
        return torch.where(squared > 0, squared.clamp_min(1e-30).sqrt(), torch.zeros_like(squared))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Predicted mean of every gene from the others, batch × genes."""
        hidden = torch.sigmoid(torch.einsum("bi,jik->bjk", x, self.masked_weight()) + self.b1)
        return (hidden * self.w2).sum(-1) + self.b2

    def restrict(self, candidates: torch.Tensor) -> None:
        """Keep only the parents where ``candidates`` (i → j, boolean) is true."""
        eye = torch.eye(self.n_genes, dtype=torch.bool, device=self.mask.device)
        self.mask.copy_((candidates.to(self.mask.device) & ~eye).to(self.mask.dtype))


def bounded_acyclicity(h: torch.Tensor, limit: float = H_LINEAR_MAX) -> torch.Tensor:
    """h up to ``limit``, then limit·(1 + log(h/limit)): the same value and slope at ``limit``, zero exactly
    where h is, and a gradient that stays in float32 range. Right after screening a dense candidate graph can
    make tr exp(A∘A) astronomically large (3.5e21 on 300 genes), and the square of γ·∇h then overflowed Adam's
    second moment, which froze every weight where it stood."""
    return torch.where(h <= limit, h, limit * (1.0 + torch.log(h.clamp_min(limit) / limit)))


def profiled_gaussian_nll(predicted: torch.Tensor, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """½ Σ_j log mean_b (x_bj − predicted_bj)²: the Gaussian NLL per cell at each gene's best variance
    (constants dropped). Invariant to rescaling any gene (it adds a constant).

    ``keep`` (batch × genes, 1 or 0): the mean over b runs over the cells where gene j's equation holds (0 where
    the gene was intervened on); a gene without such a cell in the batch adds 0.
    """
    squared = (x - predicted).pow(2)
    if keep is None:
        return 0.5 * torch.log(squared.mean(0).clamp_min(1e-8)).sum()
    n = keep.sum(0)
    mean = (squared * keep).sum(0) / n.clamp_min(1.0)
    return 0.5 * torch.where(n > 0, torch.log(mean.clamp_min(1e-8)), torch.zeros_like(mean)).sum()


def _check_size(n_cells: int, n_genes: int, hidden: int) -> None:
    """One-line errors for panels :func:`fit_parents_mlp` cannot fit (too many or too few genes, too few cells)."""
    if n_genes > MAX_GENES:
        raise ValueError(f"model='parents_mlp' fits at most {MAX_GENES} genes (M²·hidden first-layer weights), "
                         f"got {n_genes}; select fewer genes or use the default model")
    if n_genes < 2:
        raise ValueError(f"a causal graph needs at least 2 genes, got {n_genes}")
    if n_cells < min_cells(n_genes, hidden):
        raise ValueError(f"model='parents_mlp' needs at least {min_cells(n_genes, hidden)} cells for {n_genes} genes "
                         f"(one per weight of a gene's MLP), got {n_cells}; use fewer genes or the default model")


def _minibatches(Xrows, Irows, mean: np.ndarray, std: np.ndarray, batch: int, rng: np.random.Generator,
                 dev: torch.device) -> Callable[[], tuple[torch.Tensor, torch.Tensor | None]]:
    """A draw of ``batch`` cells with replacement, standardised, and its ``keep`` mask (None without interventions)."""
    n_cells = Xrows.shape[0]
    mean_t = torch.as_tensor(mean, dtype=torch.float32, device=dev)
    inv_std_t = torch.as_tensor(1.0 / std, dtype=torch.float32, device=dev)

    def minibatch() -> tuple[torch.Tensor, torch.Tensor | None]:
        idx = rng.integers(0, n_cells, size=batch)
        rows = Xrows[idx]
        rows = rows.toarray() if sp.issparse(rows) else rows
        x = (torch.as_tensor(np.asarray(rows), dtype=torch.float32, device=dev) - mean_t) * inv_std_t
        keep = None if Irows is None else 1.0 - torch.as_tensor(Irows[idx].toarray(), dtype=torch.float32,
                                                                  device=dev)
        return x, keep

    return minibatch


def _train(model: ParentsMLP, minibatch: Callable[[], tuple[torch.Tensor, torch.Tensor | None]],
           config: ParentsMLPConfig, progress_desc: str) -> tuple[dict[str, list[float]], float]:
    """SDCD's two stages on ``model`` in place (screening, then restricted to the candidates with γ·h(A) growing):
    the history every 100 steps and the last h(A) (NaN without a constrained step)."""
    screen_steps, steps, gamma_step = config.screen_steps, config.steps, config.gamma_step
    history: dict[str, list[float]] = {k: [] for k in ("step", "stage", "loss", "nll", "h", "gamma",
                                                        "edges_candidate", "max_weight")}
    bar = progress(range(screen_steps + steps), desc=progress_desc, total=screen_steps + steps)
    gamma = 0.0
    h = torch.tensor(float("nan"), dtype=torch.float64)
    optimiser = torch.optim.Adam(model.parameters(), lr=config.screen_lr)
    for t in bar:
        stage = 1 if t < screen_steps else 2
        if t == screen_steps:
            with torch.no_grad():
                A = model.adjacency()
                model.restrict(A > config.screen_fraction * A.max())
            logger.info("%s: %d candidate edges after screening", progress_desc, int(model.mask.sum()))
            optimiser = torch.optim.Adam(model.parameters(), lr=config.lr)
        x, keep = minibatch()
        A = model.adjacency()
        nll = profiled_gaussian_nll(model(x), x, keep)
        loss = nll + (config.lambda_screen if stage == 1 else config.lambda_sparse) * A.sum()
        loss = loss + config.l2 * sum(p.pow(2).sum() for p in model.parameters())
        if stage == 2:
            h = acyclicity_dense(A)
            loss = loss + gamma * bounded_acyclicity(h).to(loss.dtype)
            gamma += gamma_step
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        # Values are read on the host only every 100 steps: a read per step would make it wait for a GPU each time.
        # A divergence is caught there too (its NaN or inf stays in the weights).
        if (t + 1) % 100 == 0 or t + 1 in (screen_steps, screen_steps + steps):
            h_value = float(h.detach())
            if not np.isfinite(float(loss.detach())):
                raise FloatingPointError(f"parents-MLP training diverged in stage {stage} by step {t + 1}")
            for key, value in (("step", t + 1), ("stage", stage), ("loss", loss), ("nll", nll), ("h", h_value),
                               ("gamma", gamma), ("edges_candidate", model.mask.sum()),
                               ("max_weight", A.detach().max())):
                history[key].append(float(value.detach() if isinstance(value, torch.Tensor) else value))
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(stage=stage, nll=f"{float(nll.detach()):.4g}", h=f"{h_value:.2e}")
    return history, float(h.detach())


def _final_adjacency(model: ParentsMLP, Xrows, rng: np.random.Generator, h_value: float,
                     config: ParentsMLPConfig) -> tuple[np.ndarray, str]:
    """The fitted A (diagonal zeroed) and why it counts as collapsed (``""`` if it does not; logged as a warning)."""
    model.eval()
    with torch.no_grad():
        A = model.adjacency().detach().float().cpu().numpy().copy()
    np.fill_diagonal(A, 0.0)
    # The first layer starts at |A_ij| ≈ 0.3, so the peak says nothing here: only the data's correlations count.
    correlation, n_rows = 0.0, None
    if h_value <= 1e-8 and near_empty(A):  # what its stop rule would call converged
        rows = Xrows[np.sort(rng.permutation(Xrows.shape[0])[:COLLAPSE_CHECK_CELLS])]
        correlation, n_rows = max_correlation(rows.toarray() if sp.issparse(rows) else rows), rows.shape[0]
    remedy = (f"lower the L1 prices (lambda_screen {config.lambda_screen:g}, lambda_sparse {config.lambda_sparse:g}; "
              "cape.tl.causal_graph's lambda_sparse scales both) or give it more cells")
    message = collapse_reason(A, 0.0, correlation, None, remedy, n_rows)
    if message:
        logger.warning(message)
    return A, message


@_flushing_denormals
def fit_parents_mlp(X, config: ParentsMLPConfig | None = None, *, device: str | torch.device = "auto", seed: int = 0,
                    intervened=None, progress_desc: str = "causal graph (parents MLP)", **options) -> CausalFit:
    """Fit :class:`ParentsMLP` structural equations to X (cells × genes); see the module docstring.

    Parameters
    ----------
    X
        Cells × genes, NumPy array or SciPy sparse matrix, finite, no constant columns (checked by the
        caller); each gene is standardised before fitting.
    config
        The network's and the two stages' options (:class:`ParentsMLPConfig`; default: its defaults).
    device, seed, intervened, progress_desc
        As for :func:`cape.causal.fit_variational_notears` (``intervened``: each gene's equation is left out of the
        likelihood for the cells where it was intervened on).
    **options
        Fields of :class:`ParentsMLPConfig` by name (e.g. ``steps=300``), replacing those of ``config``; another
        name raises :class:`~cape.CapeInputError`.

    Returns
    -------
    :class:`~cape.causal.CausalFit` with ``model`` the fitted :class:`ParentsMLP` and ``history`` every
    100 steps: ``step``, ``stage``, ``loss``, ``nll``, ``h``, ``gamma``, ``edges_candidate``, ``max_weight``.
    """
    config = with_options(ParentsMLPConfig, config, options, "fit_parents_mlp")
    n_cells, n_genes = X.shape
    _check_size(n_cells, n_genes, config.hidden)
    start = time.perf_counter()
    dev = resolve_device(device) if not isinstance(device, torch.device) else device
    generator = torch.Generator().manual_seed(int(seed))
    rng = np.random.default_rng(int(seed))
    mean, std = gene_moments(X)
    std = np.where(std > 0, std, 1.0)
    Xrows = sp.csr_matrix(X) if sp.issparse(X) else np.asarray(X)
    Irows = intervention_rows(intervened, n_cells, n_genes)
    model = ParentsMLP(n_genes, hidden=config.hidden, generator=generator).to(dev)
    draw = _minibatches(Xrows, Irows, mean, std, min(int(config.batch_size), n_cells), rng, dev)
    history, h_value = _train(model, draw, config, progress_desc)
    A, message = _final_adjacency(model, Xrows, rng, h_value, config)
    peak = max(history["max_weight"], default=0.0)
    return CausalFit(adjacency=A, history=history, epochs_run=config.screen_steps + config.steps,
                     converged=h_value <= 1e-8 and not message, wall_time=time.perf_counter() - start,
                     device=str(dev), rank=None, h_every=1, model=model, mean=np.asarray(mean, dtype=np.float64),
                     std=np.asarray(std, dtype=np.float64), collapsed=bool(message), collapse_message=message,
                     peak_weight=float(peak), n_intervened=0 if Irows is None else int(Irows.nnz))
