"""Augmented-Lagrangian training of :class:`VariationalNotears` (paper Eq. 10) on minibatches.

Loss per step: −ELBO + 0.1·λs·‖A‖₁ + α·h(A) + ρ/2·h(A)², AdamW. After each inner solve — at least
``dual_every`` epochs and at least ``dual_steps`` Adam steps — comes the dual step of NOTEARS: ρ ← 10ρ
(up to ``rho_max``) unless h fell below a quarter of its value at the previous dual step, then
α ← α + ρ·h. The step count matters on small data, where an epoch has few steps: dual steps counted in
epochs alone raise ρ before any inner solve has converged, and the penalty then swamps Adam's normalised steps
and crushes every weight below τ.
ρ stops growing at ``rho_max``: 1e8 for a dense A (NOTEARS: 1e16) up to 1,000 genes, 1e4 for A = UVᵀ and for a
dense A beyond 1,000 genes. Adam moves every weight by
about lr per step, so the reverse weights keep jittering and h cannot fall much below ~1e-6 on minibatches;
beyond the cap the penalty only shrinks the true edges on paths that close such tiny cycles, while a cycle
made of weights above τ would still cost h ≫ 1e-6. The floor grows with the number of pairs that can close a
cycle (every screened pair, in both directions) and every dual step at the floor adds ρ·h to α, so on thousands of
genes and cells, with a dual step every few epochs, α·h's pull becomes a ridge on every screened weight: there
the dense A takes the low-rank cap. Low rank suffers more, and from a lower ρ: every step on U
and V moves all M² entries of UVᵀ at once, and h(UVᵀ) also prices the diagonal that the SEM masks out, so the
pull on the cycles reaches every edge. The caps were chosen with ``cape-bench causal``; the measurements are in
the documentation's benchmark pages (docs/benchmarks/step1_sdcd.md, "Low-rank fits"; step1_counts.md, "Beyond
1,000 genes").
The cap only binds on data with many minibatches: ρ grows at most tenfold per dual step,
and a dual step needs ``dual_steps`` Adam steps.
Thresholding and cycle breaking guarantee the DAG in any case.
Training stops at ``epochs`` (cut to ⌈``max_steps`` / batches⌉ on many cells and genes, :func:`planned_epochs`:
100 epochs of 10,000 cells would be 7,900 steps) or earlier once h ≤ ``h_tol`` and the epoch loss changed by less
than ``loss_tol`` (relative) — i.e. when h has converged and the fit has settled. An A driven to (nearly) zero
also has h = 0 and a flat loss: a fit that ends so although the data had signal (its weights had reached
:data:`COLLAPSE_SIGNAL`, or, when the stop rule fired, two genes' features correlate by more than twice the L1
price of a unit weight, so a dense A would have kept that edge) is reported as ``collapsed`` (not converged),
with a warning naming what to change (:func:`collapse_reason`). A few strong weights among many genes that end
where they peaked are a sparse graph, not a collapse.

Minibatches are sliced from X (NumPy array or SciPy sparse matrix) row by row and standardised per gene
with statistics computed without densifying X, so memory stays O(batch × genes).

The exact acyclicity term needs an exponential of size min(M, k) (k = r(r+1)/2) every step: at k = 820
(r = 40) that costs more than the rest of the step. With ``h_every`` = K > 1 the exact h
and its gradient are computed every K steps only, and the steps in between use h's first-order model in
A∘A at that point, :class:`~cape.causal.acyclicity_penalty.LinearisedAcyclicity`: h(A₀) + Σ W_ij (A_ij² − A₀_ij²)
with W = exp(A₀∘A₀)ᵀ, evaluated at the current A in O(M²). Its gradient 2W∘A pulls every weight towards
zero and fades as the weight does. Reusing the old gradient instead is not safe for A = UVᵀ, where one
Adam step moves every entry of A through all r components: a low-rank fit with a stale gradient collapses,
while the linearised penalty keeps the graph of exact steps. ``h_every=None``
picks exact steps while min(M, k) ≤ :data:`EXACT_ACYCLICITY_MAX` and :data:`AUTO_H_EVERY` above
(:data:`AUTO_H_EVERY_LARGE` beyond :data:`AUTO_H_EVERY_LARGE_M` genes). Between exact steps the low-rank L1
and linearised penalties share one UVᵀ and one backward pass
(:meth:`~cape.causal.acyclicity_penalty.LinearisedAcyclicity.low_rank_l1_and_h`).

The per-gene MLPs are most of a step's cost on CPU; they are run through ``torch.compile`` there for every fit
with enough work to repay the compiling (``compile_mlp``, :func:`compiles_by_default`), falling back to eager
kernels with a warning where compiling fails, and the decoder, which
only serves the reconstruction term (with Z = μ_Z, A cancels out of it), sees a random quarter of each batch
(``recon_fraction``), which cuts a large fit's time with the same graph.

On CUDA a step of a small model is bound by the host's launch of its ~150 kernels, not by the GPU. There, with the
matrix resident on the device and the penalty linearised between exact steps, the whole step — gathering the batch's
rows, forward, backward, AdamW, the epoch sums — is captured once per batch size as a CUDA graph and replayed
(``cuda_graphs``, :class:`cape._cuda_graphs.CapturedStep`): the batches, the order of updates and the graph are
those of the kernel-by-kernel loop. ρ and α then live in a device tensor and the linearisation is moved in place.

The measured costs and graphs behind these choices are in docs/benchmarks/step1_scale.md and throughput.md.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import torch

from .._allocator import keep_freed_blocks
from .._cuda_graphs import CapturedStep
from .._options import with_options
from .._progress import progress
from .._settings import PROGRESS, resolve_device
from .acyclicity_penalty import LinearisedAcyclicity
from .causal_config import MAX_GENE_STEPS, NotearsConfig
from .model import VariationalNotears

__all__ = ["COLLAPSE_FLOOR", "COLLAPSE_RETAINED", "COLLAPSE_SIGNAL", "MIN_CELLS", "CausalFit", "NotearsConfig",
           "collapse_reason", "compiles_by_default", "fit_variational_notears", "gene_moments", "intervention_rows",
           "max_correlation", "near_empty", "planned_epochs", "step_limit"]

logger = logging.getLogger("cape")

#: Fewest cells a causal graph is fitted on (cape.tl.causal_graph refuses fewer; cape.pp.preprocess checks it
#: after QC). Fewer cells than genes only warns.
MIN_CELLS = 10
#: Price of one unit of |A_ij| in the loss per λs (see ``lambda_sparse`` in :func:`fit_variational_notears`).
L1_UNIT = 0.1
#: Collapse guard: a weight counts as an edge above this size (the optimiser's noise floor, ``AUTO_TAU_FLOOR``) ...
COLLAPSE_FLOOR = 0.01
#: ... a fit ending with fewer weights above it than this share of the genes (at least one) is near-empty ...
COLLAPSE_EDGES_PER_GENE = 0.02
#: ... and has collapsed if the data had signal: its largest ``|A_ij|`` at the end of an epoch reached this (above the
#: ~0.05 of a fresh low-rank A), or two genes' features correlate by more than this and by more than
#: :data:`COLLAPSE_PRICE_MARGIN` times the L1 price of a unit weight (a dense A would then gain from that edge).
COLLAPSE_SIGNAL = 0.1
COLLAPSE_PRICE_MARGIN = 2.0
#: A near-empty A whose largest weight ends at or above this share of its peak (and above :data:`COLLAPSE_SIGNAL`)
#: is a sparse graph, not a collapse: a collapse drives every weight down by an order of magnitude, the strongest
#: included, while the dual steps that settle a two-gene cycle can leave its surviving edge at a third of its peak.
COLLAPSE_RETAINED = 0.2
#: Cells the feature correlations of the collapse check are computed on (at most).
COLLAPSE_CHECK_CELLS = 2048

@dataclass
class CausalFit:
    """Result of :func:`fit_variational_notears`.

    Attributes
    ----------
    adjacency
        Learnt weighted M×M adjacency (before thresholding; diagonal set to 0), float32.
    history
        Per epoch: ``loss``, ``nelbo``, ``h``, ``rho``, ``alpha``, ``max_weight`` (largest ``|A_ij|``), ``seconds``.
    epochs_run, converged, wall_time, device, rank, h_every, rho_max, compiled_mlp, recon_fraction, cuda_graphs
        Bookkeeping of the run (``rank`` None = dense; ``rho_max`` None: no augmented Lagrangian, as in
        :func:`cape.causal.fit_parents_mlp`; ``cuda_graphs``: the steps were replayed as CUDA graphs).
    model
        The fitted :class:`VariationalNotears` (eval mode): its encoder and decoder are the structural
        equations that :func:`cape.causal.structural_equations.learned_equations` reads.
    mean, std
        The per-gene standardisation applied to X before the model saw it (float64).
    collapsed, collapse_message
        Whether A ended (nearly) empty although the data had signal (then ``converged`` is False; the data's
        correlations are only consulted when the stop rule fired, see :func:`collapse_reason`), and a one-line
        explanation with what to change (see :func:`collapse_reason`); ``peak_weight`` is the largest ``|A_ij|`` met
        at the end of any epoch.
    n_intervened
        Cell × gene entries whose own equation was left out (``intervened``; 0 without interventions).
    sparse
        Whether A was stored as its candidate weights only (``sparse`` of :class:`~cape.causal.NotearsConfig`).
    """

    adjacency: np.ndarray
    history: dict[str, list[float]] = field(default_factory=dict)
    epochs_run: int = 0
    converged: bool = False
    wall_time: float = 0.0
    device: str = "cpu"
    rank: int | None = None
    h_every: int = 1
    rho_max: float | None = None
    compiled_mlp: bool = False
    recon_fraction: float = 1.0
    cuda_graphs: bool = False
    model: VariationalNotears | None = None
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    collapsed: bool = False
    collapse_message: str = ""
    peak_weight: float = 0.0
    n_intervened: int = 0
    sparse: bool = False


def near_empty(A: np.ndarray) -> bool:
    """Fewer than max(1, :data:`COLLAPSE_EDGES_PER_GENE` · M) off-diagonal weights above :data:`COLLAPSE_FLOOR`."""
    A = np.abs(np.asarray(A))
    above = int(np.count_nonzero(A > COLLAPSE_FLOOR)) - int(np.count_nonzero(np.diag(A) > COLLAPSE_FLOOR))
    return above < max(1, math.ceil(COLLAPSE_EDGES_PER_GENE * A.shape[0]))


def max_correlation(F: np.ndarray) -> float:
    """Largest absolute Pearson correlation between two different columns of F (0 for fewer than two usable columns)."""
    F = np.asarray(F, dtype=np.float64)
    F = F - F.mean(0)
    norm = np.sqrt((F * F).sum(0))
    F = F[:, norm > 1e-12] / norm[norm > 1e-12]
    if F.shape[1] < 2:
        return 0.0
    C = np.abs(F.T @ F)
    np.fill_diagonal(C, 0.0)
    return float(C.max())


def null_max_correlation(n_genes: int, n_rows: int) -> float:
    """About the largest absolute correlation among M(M − 1)/2 pairs of independent genes on ``n_rows`` cells that a 5 %
    Bonferroni test lets through: √(2·ln(pairs / 0.05) / n)."""
    pairs = max(n_genes * (n_genes - 1) // 2, 1)
    return math.sqrt(2.0 * math.log(pairs / 0.05) / max(n_rows, 1))


def collapse_reason(A: np.ndarray, peak_weight: float, correlation: float, price: float | None, remedy: str,
                    n_rows: int | None = None) -> str:
    """Why A counts as collapsed, with ``remedy``, or ``""`` when it does not.

    A near-empty A (:func:`near_empty`) after a fit that had signal — its largest weight reached
    :data:`COLLAPSE_SIGNAL` at some epoch, or two genes' features correlate by ``correlation`` > max(
    :data:`COLLAPSE_SIGNAL`, :data:`COLLAPSE_PRICE_MARGIN` · ``price``, the largest correlation independent genes
    reach on ``n_rows`` cells (:func:`null_max_correlation`)), ``price`` being the L1 price of a unit weight
    (``None``: not comparable) — has lost what the data hold: a penalty won against them, and the stop rule's
    h = 0 and flat loss say nothing about the graph. A near-empty A whose largest weight still stands at
    :data:`COLLAPSE_SIGNAL` or more and at :data:`COLLAPSE_RETAINED` of its peak or more is a sparse graph (a few
    strong edges among many genes), not a collapse: a penalty that wins drives the strongest weights down too.
    """
    if not near_empty(A):
        return ""
    off_diagonal = np.abs(np.asarray(A, dtype=np.float64))
    np.fill_diagonal(off_diagonal, 0.0)
    largest = float(off_diagonal.max()) if off_diagonal.size else 0.0
    if largest >= max(COLLAPSE_SIGNAL, COLLAPSE_RETAINED * peak_weight):
        return ""
    bound = max(COLLAPSE_SIGNAL, COLLAPSE_PRICE_MARGIN * price if price is not None else 0.0,
                null_max_correlation(np.shape(A)[0], n_rows) if n_rows else 0.0)
    if peak_weight < COLLAPSE_SIGNAL and correlation <= bound:
        return ""
    A = np.abs(np.asarray(A))
    above = int(np.count_nonzero(A > COLLAPSE_FLOOR)) - int(np.count_nonzero(np.diag(A) > COLLAPSE_FLOOR))
    evidence = (f"its weights reached {peak_weight:.2g} during the fit" if peak_weight >= COLLAPSE_SIGNAL else
                f"two genes' features correlate by {correlation:.2g}"
                + (f", above the L1 price {price:.2g} of a unit weight" if price is not None else ""))
    return (f"Step I collapsed: A ended with {above} weight(s) above {COLLAPSE_FLOOR} among {A.shape[0]} genes "
            f"(largest {largest:.2g}) although {evidence}; {remedy}")


def intervention_rows(intervened, n_cells: int, n_genes: int):
    """``intervened`` (cells × genes, True where the gene was intervened on in that cell) as a CSR matrix or None."""
    if intervened is None:
        return None
    mask = sp.csr_matrix(intervened, dtype=np.float32)
    if mask.shape != (n_cells, n_genes):
        raise ValueError(f"intervened must be cells × genes = {(n_cells, n_genes)}, got {mask.shape}")
    mask.data = (mask.data != 0).astype(np.float32)
    mask.eliminate_zeros()
    return mask


def gene_moments(X) -> tuple[np.ndarray, np.ndarray]:
    """Per-column mean and standard deviation of a dense or sparse matrix (float64, no densifying)."""
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        mean = np.asarray(X.mean(axis=0), dtype=np.float64).ravel()
        sq = np.asarray(X.multiply(X).mean(axis=0), dtype=np.float64).ravel()
    else:
        Xd = np.asarray(X, dtype=np.float64)
        mean = Xd.mean(axis=0)
        sq = (Xd * Xd).mean(axis=0)
    var = np.maximum(sq - mean * mean, 0.0)
    return mean, np.sqrt(var)


#: ``h_every=None``: exact acyclicity every step while the exponential is at most this size (cheap).
EXACT_ACYCLICITY_MAX = 256
#: ``h_every=None`` above that size: re-linearise the acyclicity penalty every this many steps ...
AUTO_H_EVERY = 10
#: ... and every :data:`AUTO_H_EVERY_LARGE` steps beyond this many genes, where one re-linearisation (an M×M
#: product through the k×k factors) costs several steps' worth: at 1,200 genes re-linearising every 40
#: steps instead of 10 left the graph's F1 unchanged (see ``cape-bench causal-scale``).
AUTO_H_EVERY_LARGE_M = 1000
AUTO_H_EVERY_LARGE = 40


#: ``sparse=None``: a candidate-restricted A stores only its candidate weights beyond this many genes, where the
#: encoder's dense B×M×M product and the decoder's M×M solve would dominate a step.
SPARSE_MIN_GENES = 1000


#: ``rho_max=None``: the augmented Lagrangian's largest ρ for a dense A up to :data:`SPARSE_MIN_GENES` genes ...
RHO_MAX_DENSE = 1e8
#: ... and for A = UVᵀ and for a dense A beyond that (see the module docstring).
RHO_MAX_LOW_RANK = 1e4


def resolve_rho_max(rho_max: float | None, rank: int | None, n_genes: int = 0) -> float:
    """The cap on ρ (``None``: by the parameterisation and size of A, see the module docstring)."""
    if rho_max is None:
        return RHO_MAX_DENSE if rank is None and n_genes <= SPARSE_MIN_GENES else RHO_MAX_LOW_RANK
    if not math.isfinite(rho_max) or rho_max <= 0:
        raise ValueError(f"rho_max must be a finite number > 0 (or None: automatic), got {rho_max}")
    return float(rho_max)


def resolve_h_every(h_every: int | None, n_genes: int, rank: int | None) -> int:
    """Steps between exact acyclicity evaluations (``None``: automatic, see the module docstring)."""
    if h_every is None:
        size = n_genes if rank is None else min(n_genes, rank * (rank + 1) // 2)
        if size <= EXACT_ACYCLICITY_MAX:
            return 1
        return AUTO_H_EVERY if n_genes <= AUTO_H_EVERY_LARGE_M else AUTO_H_EVERY_LARGE
    if int(h_every) != h_every or h_every < 1:
        raise ValueError(f"h_every must be a whole number of steps ≥ 1 (or None: automatic), got {h_every}")
    return int(h_every)


#: ``recon_fraction=None``: the reconstruction term on every cell of a batch below this many (batch × genes ×
#: hidden) activations, on :data:`RECON_FRACTION_AT_SCALE` of them from there on (the per-gene MLPs are then
#: most of a step's cost, and the decoder's half is only needed for the reconstruction term).
RECON_SUBSAMPLE_MIN_ELEMENTS = 1 << 23
RECON_FRACTION_AT_SCALE = 0.25

#: ``compile_mlp=None`` compiles the MLPs on CPU when a fit's planned work, epochs (:func:`planned_epochs`) × cells
#: × genes × hidden activations, reaches this: compiled, the MLPs run about twice as fast from 100 genes on, and this
#: much work saves about the seconds that compiling costs on a machine whose on-disk cache does not hold the kernels
#: yet (a newcomer's first run; later fits find them there). Below it, the first run would pay more than it saves.
COMPILE_MIN_WORK = 1 << 32


def _enable_compiled_mlps(model: VariationalNotears, *batches: torch.Tensor) -> bool:
    """Switch the model's MLPs to the compiled kernels if trial forward/backward passes on a copy work.

    One trial per batch size met in training, so that compiling (and the recompile for a second shape)
    happens here and not inside the timed epochs.
    """

    trial = copy.deepcopy(model)
    for mlp in (trial.encoder_mlp, trial.decoder_mlp):
        mlp.compiled = True
    try:
        for xb in batches:
            trial(xb)["nelbo"].backward()
    except Exception as err:  # no compiler, unsupported platform: eager kernels are always correct
        logger.warning("torch.compile of the per-gene MLPs failed (%s: %s); using eager kernels",
                       type(err).__name__, str(err).splitlines()[0] if str(err) else "")
        return False
    for mlp in (model.encoder_mlp, model.decoder_mlp):
        mlp.compiled = True
    return True


def _flushing_denormals(fit):
    """Run ``fit`` with denormal floats flushed to zero, then restore torch's default (off).

    The L1 penalty drives most weights towards zero, and once values below float32's smallest normal number
    (~1.2e-38) appear, x86 CPUs compute on them many times slower, which late in a long fit can make whole
    epochs several times slower. Flushing changes no value above that size.
    """

    @functools.wraps(fit)
    def wrapper(*args, **kwargs):
        torch.set_flush_denormal(True)
        try:
            return fit(*args, **kwargs)
        finally:
            torch.set_flush_denormal(False)

    return wrapper


#: On CUDA the standardised matrix (and the intervention mask) stay on the device when they take at most this share of
#: its free memory: one host-to-device copy per fit instead of one per step.
RESIDENT_MAX_SHARE = 0.25


def _fits_on_device(dev: torch.device, n_bytes: int) -> bool:
    """Whether ``n_bytes`` more can stay resident on ``dev`` (CUDA only: on the CPU rows are sliced per batch)."""
    if dev.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(dev)
    return n_bytes <= RESIDENT_MAX_SHARE * free


def _dense_rows(rows, dev: torch.device, chunk: int = 4096) -> torch.Tensor:
    """A dense float32 copy of ``rows`` (NumPy or CSR) on ``dev``, densified ``chunk`` rows at a time."""
    out = torch.empty(rows.shape, dtype=torch.float32, device=dev)
    for lo in range(0, rows.shape[0], chunk):
        part = rows[lo:lo + chunk]
        part = part.toarray() if sp.issparse(part) else part
        out[lo:lo + chunk] = torch.as_tensor(part, dtype=torch.float32).to(dev, non_blocking=False)
    return out


class _Standardised:
    """Rows of X sliced, densified and standardised per batch, on the device (memory O(batch × genes)).

    On CUDA, where the standardised matrix fits (:data:`RESIDENT_MAX_SHARE` of the free memory), it is built once on
    the device and batches are gathered there (the same float32 values: the same subtraction and product per entry).
    """

    def __init__(self, X, standardize: str | bool, dev: torch.device) -> None:
        mean, std = gene_moments(X)
        self.raw_std = np.where(std > 0, std, 1.0)
        if standardize is False or standardize == "none":
            mean, std = np.zeros_like(mean), np.ones_like(std)
        self.mean, self.std = mean, np.where(std > 0, std, 1.0)
        self.mean_t = torch.as_tensor(self.mean, dtype=torch.float32, device=dev)
        self.inv_std_t = torch.as_tensor(1.0 / self.std, dtype=torch.float32, device=dev)
        self.rows = sp.csr_matrix(X) if sp.issparse(X) else np.asarray(X)
        self.dev = dev
        self.resident: torch.Tensor | None = None
        if _fits_on_device(dev, 4 * X.shape[0] * X.shape[1]):
            self.resident = _dense_rows(self.rows, dev).sub_(self.mean_t).mul_(self.inv_std_t)

    def __call__(self, idx) -> torch.Tensor:
        if self.resident is not None:
            if isinstance(idx, slice):
                return self.resident[idx]
            return self.resident.index_select(0, torch.as_tensor(idx, device=self.dev))
        rows = self.rows[idx]
        rows = rows.toarray() if sp.issparse(rows) else rows
        return (torch.as_tensor(rows, dtype=torch.float32, device=self.dev) - self.mean_t) * self.inv_std_t


class _Kept:
    """1 − the intervention mask of a batch's rows (None without interventions), resident on CUDA where it fits."""

    def __init__(self, Irows, dev: torch.device) -> None:
        self.Irows, self.dev, self.resident = Irows, dev, None
        if Irows is not None and _fits_on_device(dev, 4 * Irows.shape[0] * Irows.shape[1]):
            self.resident = _dense_rows(Irows, dev).neg_().add_(1.0)

    def __call__(self, idx) -> torch.Tensor | None:
        if self.Irows is None:
            return None
        if self.resident is not None:
            return self.resident.index_select(0, torch.as_tensor(idx, device=self.dev))
        if isinstance(idx, torch.Tensor):  # the data fitted on the device, the mask (checked after it) did not
            idx = idx.cpu().numpy()
        return 1.0 - torch.as_tensor(self.Irows[idx].toarray(), dtype=torch.float32, device=self.dev)


def resolve_sparse(sparse: bool | None, n_genes: int, candidates) -> bool:
    """Whether a candidate-restricted A stores only its candidate weights (``None``: beyond
    :data:`SPARSE_MIN_GENES` genes)."""
    if sparse is None:
        return candidates is not None and n_genes > SPARSE_MIN_GENES
    if sparse and candidates is None:
        raise ValueError("sparse=True stores the candidate weights only: pass candidates")
    return bool(sparse)


def _build_model(data: _Standardised, config: NotearsConfig, seed: int, candidates) -> VariationalNotears:
    """The SEM on the device, A restricted to ``candidates`` and the features scaled for ``feature_norm="data"``."""
    n_genes = data.mean.size
    if candidates is not None and config.rank is not None:
        raise ValueError("candidates restrict a dense A only (rank=None)")
    model = VariationalNotears(n_genes, rank=config.rank, hidden=config.hidden, seed=seed,
                               sample_latent=config.sample_latent, feature_norm=config.feature_norm,
                               candidates=candidates,
                               sparse=resolve_sparse(config.sparse, n_genes, candidates)).to(data.dev)
    if config.feature_norm == "data":
        model.set_feature_scale(torch.as_tensor(data.raw_std / data.std, dtype=torch.float32))
    return model


def _optimiser(model: VariationalNotears, config: NotearsConfig, capturable: bool = False) -> torch.optim.AdamW:
    """AdamW; L1 and the acyclicity penalty already regularise A, so weight decay acts on the MLPs only.
    ``capturable``: its step count on the device, as a step captured in a CUDA graph needs."""
    adj_ids = {id(p) for p in model.adjacency_parameters()}
    other = [p for p in model.parameters() if id(p) not in adj_ids]
    # CUDA: the fused kernel, one launch for all parameters instead of several per parameter (the CPU keeps torch's
    # default implementation, so CPU fits are unchanged).
    fused = True if next(model.parameters()).device.type == "cuda" else None
    return torch.optim.AdamW([{"params": other, "weight_decay": config.weight_decay},
                              {"params": model.adjacency_parameters(), "weight_decay": 0.0}], lr=config.lr,
                             fused=fused, capturable=capturable)


def compiles_by_default(config: NotearsConfig, n_cells: int, n_genes: int, device: torch.device) -> bool:
    """Whether ``compile_mlp=None`` compiles the MLPs: on CPU, for a fit of :data:`COMPILE_MIN_WORK` or more."""
    work = planned_epochs(config, n_cells, n_genes) * n_cells * n_genes * config.hidden
    return device.type == "cpu" and work >= COMPILE_MIN_WORK


def _compile_if_worth(model: VariationalNotears, data: _Standardised, config: NotearsConfig, n_cells: int) -> bool:
    """``compile_mlp`` resolved (``None``: on CPU for fits of :data:`COMPILE_MIN_WORK` or more) and applied; False
    where compiling failed."""
    compile_mlp = config.compile_mlp
    if compile_mlp is None:
        compile_mlp = compiles_by_default(config, n_cells, data.mean.size, data.dev)
    if not compile_mlp:
        return False
    n_batches = max(1, math.ceil(n_cells / config.batch_size))
    sizes = sorted({len(b) for b in np.array_split(np.arange(n_cells), n_batches)})
    return _enable_compiled_mlps(model, *(data(slice(0, size)) for size in sizes))


def _recon_fraction(config: NotearsConfig, n_cells: int, n_genes: int) -> float:
    """``recon_fraction`` resolved (``None``: 1 below :data:`RECON_SUBSAMPLE_MIN_ELEMENTS`, else a quarter)."""
    if config.recon_fraction is not None:
        return float(config.recon_fraction)
    elements = min(config.batch_size, n_cells) * n_genes * max(config.hidden, 1)
    return 1.0 if elements < RECON_SUBSAMPLE_MIN_ELEMENTS else RECON_FRACTION_AT_SCALE


@dataclass
class _Lagrangian:
    """State of the augmented Lagrangian: ρ, α and the dual-step bookkeeping."""

    rho: float
    rho_max: float
    alpha: float = 0.0
    h_prev: float = math.inf
    dual_epoch: int = 0
    last_dual_step: int = 0

    #: (α, ρ) on the device for a step captured as a CUDA graph, which would otherwise keep the values it was captured
    #: with; None: Python floats (the same float64 arithmetic).
    on_device: torch.Tensor | None = None

    def keep_on(self, device: torch.device) -> None:
        """Hold (α, ρ) in a device tensor that :meth:`dual_step` updates in place."""
        self.on_device = torch.tensor([self.alpha, self.rho], dtype=torch.float64, device=device)

    def penalty(self, h: torch.Tensor) -> torch.Tensor:
        # h ≥ 0, but its linear model can undershoot below 0: never let ρh turn the pull around.
        h_pos = h.clamp_min(0.0)
        alpha, rho = (self.alpha, self.rho) if self.on_device is None else self.on_device.unbind()
        return alpha * h + 0.5 * rho * h_pos * h_pos

    def dual_step(self, epoch: int, step: int, h_now: float, config: NotearsConfig) -> None:
        """Once the inner solve has had ``dual_every`` epochs and ``dual_steps`` Adam steps (on small data an
        epoch is a few steps, too few to solve it): ρ ← 10ρ unless h fell below a quarter, then α ← α + ρh."""
        if epoch + 1 - self.dual_epoch >= config.dual_every and step - self.last_dual_step >= config.dual_steps:
            self.dual_epoch, self.last_dual_step = epoch + 1, step
            if h_now > 0.25 * self.h_prev:
                self.rho = min(self.rho * 10.0, self.rho_max)
            self.alpha += self.rho * h_now
            self.h_prev = h_now
            if self.on_device is not None:
                self.on_device.copy_(torch.tensor([self.alpha, self.rho], dtype=torch.float64), non_blocking=False)


class _Run:
    """One fit's minibatch loop: the model, its optimiser, the Lagrangian, the step counter and the epoch's summed
    loss and −ELBO (on the device, read once per epoch). On CUDA the step can be replayed as a CUDA graph
    (:class:`~cape._cuda_graphs.CapturedStep`): the batch's rows are then gathered inside the graph from the matrix
    kept on the device, and the optimiser, ρ and α and the linearised penalty keep their tensors in place."""

    def __init__(self, model: VariationalNotears, config: NotearsConfig, h_every: int, lagrangian: _Lagrangian,
                 recon_rows: int | None, data: _Standardised, kept: _Kept) -> None:
        self.model, self.config, self.h_every, self.lagrangian = model, config, h_every, lagrangian
        self.data, self.kept = data, kept
        graphs = _use_cuda_graphs(config, data, kept, h_every)
        self.optimiser = _optimiser(model, config, capturable=graphs)
        self.recon_rows = recon_rows
        self.linearised: LinearisedAcyclicity | None = None
        self.step = 0
        self.sums = torch.zeros(2, dtype=torch.float64, device=data.dev)
        self.captured: CapturedStep | None = None
        if graphs:
            lagrangian.keep_on(data.dev)
            self.captured = CapturedStep(self._indexed_step, name="Step I training step")

    def batch(self, idx) -> None:
        """One AdamW step on the batch of rows ``idx``; its loss and −ELBO are added to :attr:`sums`."""
        model = self.model
        if self.h_every > 1 and (self.step % self.h_every == 0 or self.linearised is None):
            with torch.no_grad():
                fresh = LinearisedAcyclicity(model.acyclicity_matrix(), *(
                    () if model.rank is None else (model.U, model.V)), entries=model.edge_index(),
                    blocks=model.support_blocks())
            # A captured step reads the old point's tensors: move them rather than the reference.
            self.linearised = fresh if self.linearised is None else self.linearised.assign_(fresh)
        if self.captured is not None:
            self.captured(idx)
        else:
            self._step(self.data(idx), self.kept(idx))
        self.step += 1

    def _indexed_step(self, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self._step(self.data(idx), self.kept(idx))
        return (self.sums,)

    def _step(self, xb: torch.Tensor, keep: torch.Tensor | None) -> None:
        """Forward, one backward pass, the AdamW update and the sums, with no read on the host (reading would make
        the host wait for the device at every step, and cannot be captured)."""
        model, lam, l1_price = self.model, self.lagrangian, L1_UNIT * self.config.lambda_sparse
        terms = model(xb, recon_rows=self.recon_rows, keep=keep)
        self.optimiser.zero_grad(set_to_none=True)
        if self.h_every > 1 and model.rank is not None:
            # Low rank between exact steps: L1 and the linearised h from one UVᵀ, one backward pass.
            l1, h = self.linearised.low_rank_l1_and_h(model.U, model.V)
            loss = terms["nelbo"] + l1_price * l1
            (loss + lam.penalty(h).to(loss.dtype)).backward()
        else:
            loss = terms["nelbo"] + l1_price * model.l1()
            h = (model.acyclicity() if self.h_every == 1 else
                 self.linearised(model.edge_weight if model.sparse else model.acyclicity_matrix()))
            # One backward pass; the penalty's gradient stays float64 down to A, as h is.
            (loss.double() + lam.penalty(h)).backward()
        self.optimiser.step()
        self.sums += torch.stack((loss.detach().double(), terms["nelbo"].detach().double()))


def _use_cuda_graphs(config: NotearsConfig, data: _Standardised, kept: _Kept, h_every: int) -> bool:
    """``cuda_graphs`` resolved (``None``: on CUDA with the rows gathered on the device and the acyclicity penalty
    linearised between exact steps; the exact penalty's matrix exponential is not captured)."""
    possible = (data.dev.type == "cuda" and data.resident is not None and h_every > 1 and not config.sample_latent
                and (kept.Irows is None or kept.resident is not None))
    if config.cuda_graphs and not possible:
        logger.info("Step I: cuda_graphs=True needs CUDA, the matrix resident on the device, h_every > 1 and "
                    "sample_latent=False; running kernel by kernel")
    return possible and config.cuda_graphs is not False


def _epoch_batches(rng: np.random.Generator, n_cells: int, n_batches: int, data: _Standardised) -> list:
    """One epoch's batches of row indices, each sorted: near-equal sizes (differing by at most one), never a batch of
    one cell, which batch normalisation of f(X) cannot use. With the rows resident on the device, the indices go
    there in one copy per epoch."""
    batches = [np.sort(batch) for batch in np.array_split(rng.permutation(n_cells), n_batches)]
    if data.resident is None:
        return batches
    flat = torch.as_tensor(np.concatenate(batches), device=data.dev)
    return list(torch.split(flat, [len(batch) for batch in batches]))


def _train(run: _Run, rng: np.random.Generator, progress_desc: str) -> tuple[dict[str, list[float]], int, bool]:
    """The epochs of a fit: its history, the epochs run and whether the stop rule fired."""
    config, model, lam, data = run.config, run.model, run.lagrangian, run.data
    n_cells, n_genes = data.rows.shape
    history: dict[str, list[float]] = {k: [] for k in ("loss", "nelbo", "h", "rho", "alpha", "max_weight",
                                                        "seconds")}
    n_batches = max(1, math.ceil(n_cells / config.batch_size))
    n_epochs = planned_epochs(config, n_cells, n_genes)
    if n_epochs < config.epochs:
        limit = step_limit(config.max_steps, n_genes)
        why = (f"at most {limit} steps: max_steps={config.max_steps}" if n_epochs <= math.ceil(limit / n_batches)
               else f"max_steps={config.max_steps} allows {limit} steps, fewer than min_epochs={config.min_epochs}")
        logger.log(PROGRESS, "%s: %d of %d epochs, %d batches each (%s)", progress_desc, n_epochs, config.epochs,
                   n_batches, why)
    bar = progress(range(n_epochs), desc=progress_desc, total=n_epochs, unit="epoch")
    epoch, converged = -1, False
    for epoch in bar:
        t_epoch = time.perf_counter()
        model.train()
        # Summed on the device in float64 (as Python floats were), read once per epoch.
        run.sums.zero_()
        for idx in _epoch_batches(rng, n_cells, n_batches, data):
            run.batch(idx)
        with torch.no_grad():
            h_now = float(model.acyclicity())
            max_weight = float(model.adjacency().abs().max())
        lam.dual_step(epoch, run.step, h_now, config)
        loss_sum, nelbo_sum = run.sums.tolist()
        epoch_loss = loss_sum / n_batches
        for key, value in (("loss", epoch_loss), ("nelbo", nelbo_sum / n_batches), ("h", h_now), ("rho", lam.rho),
                           ("alpha", lam.alpha), ("max_weight", max_weight),
                           ("seconds", time.perf_counter() - t_epoch)):
            history[key].append(value)
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(loss=f"{epoch_loss:.4g}", h=f"{h_now:.2e}", rho=f"{lam.rho:.0e}")
        logger.debug("epoch %d loss %.5g h %.3e rho %.1e", epoch, epoch_loss, h_now, lam.rho)
        if not all(math.isfinite(v) for v in (epoch_loss, h_now)):
            raise FloatingPointError(f"causal graph training diverged at epoch {epoch} (loss {epoch_loss}, h {h_now})")
        if _settled(history["loss"], epoch, h_now, config):
            converged = True  # unless the graph collapsed (checked by the caller)
            break
    if hasattr(bar, "close"):
        bar.close()
    return history, epoch + 1, converged


def step_limit(max_steps: int | str | None, n_genes: int) -> int | None:
    """The most AdamW steps of a fit on ``n_genes`` genes: ``max_steps``, with ``"auto"`` resolved to
    ⌈:data:`~cape.causal.causal_config.MAX_GENE_STEPS` / genes⌉ (``None``: no limit)."""
    if max_steps == "auto":
        return math.ceil(MAX_GENE_STEPS / max(1, n_genes))
    return max_steps


def planned_epochs(config: NotearsConfig, n_cells: int, n_genes: int) -> int:
    """The epochs a fit of ``n_cells`` × ``n_genes`` runs at most: ``epochs``, cut to ⌈:func:`step_limit` / batches
    per epoch⌉; under ``max_steps="auto"`` never to fewer than ``min_epochs``."""
    limit = step_limit(config.max_steps, n_genes)
    if limit is None:
        return config.epochs
    n_batches = max(1, math.ceil(n_cells / config.batch_size))
    epochs = max(1, math.ceil(limit / n_batches))
    if config.max_steps == "auto":
        # A bound on time, not on what a fit needs: never below the stop rule's own minimum (a fit cut to a few
        # epochs of very many cells ends before A leaves the L1's zero; docs/benchmarks/throughput.md).
        epochs = max(epochs, config.min_epochs)
    return min(config.epochs, epochs)


def _settled(losses: list[float], epoch: int, h_now: float, config: NotearsConfig) -> bool:
    """The stop rule: past ``min_epochs``, h ≤ ``h_tol`` and the epoch loss changed by at most ``loss_tol``."""
    if epoch + 1 < config.min_epochs or h_now > config.h_tol or len(losses) < 2:
        return False
    return abs(losses[-1] - losses[-2]) <= config.loss_tol * max(abs(losses[-2]), 1e-12)


def _collapse_message(model: VariationalNotears, A: np.ndarray, peak: float, converged: bool, data: _Standardised,
                      rng: np.random.Generator, config: NotearsConfig) -> str:
    """:func:`collapse_reason` of a finished fit, with the data's feature correlations where the stop rule fired."""
    correlation, n_rows = 0.0, None
    # A near-empty A that the stop rule calls converged: what do the data offer, in the features the SEM sees (a few
    # seconds at most)? Without the stop rule a near-empty A is under-training (e.g. 2 epochs from A = 0), which
    # converged=False already says.
    if converged and near_empty(A):
        n_cells = data.rows.shape[0]
        with torch.no_grad():
            xb = data(np.sort(rng.permutation(n_cells)[:COLLAPSE_CHECK_CELLS]))
            features = model.feature_norm(model.encoder_mlp(xb)) * model.feature_scale
        correlation, n_rows = max_correlation(features.cpu().numpy()), len(xb)
    rank, lambda_sparse = config.rank, config.lambda_sparse
    return collapse_reason(A, peak, correlation, L1_UNIT * lambda_sparse,
                           f"lower lambda_sparse (got {lambda_sparse:g})"
                           + (f", use a dense A (rank=None instead of {rank})" if rank is not None else "")
                           + " or give it more cells", n_rows)


@_flushing_denormals
def fit_variational_notears(X, config: NotearsConfig | None = None, *, device: str | torch.device = "auto",
                            seed: int = 0, intervened=None, candidates=None, progress_desc: str = "causal graph",
                            **options) -> CausalFit:
    """Fit a variational NOTEARS model to X (cells × genes) and return the learnt weighted adjacency.

    Parameters
    ----------
    X
        Cells × genes, NumPy array or SciPy sparse matrix, finite, no constant columns (checked by the caller).
    config
        The SEM's, AdamW's and the augmented Lagrangian's options (:class:`~cape.causal.NotearsConfig`; default:
        rank 40, λs 1, 100 epochs, batch 128, lr 3e-3). With ``h_every`` > 1 the acyclicity penalty is exact every
        ``h_every`` steps and uses its first-order model in A∘A in between (module docstring).
    device
        ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"`` or a ``torch.device``.
    seed
        Seeds the initialisation, the minibatch order and the reconstruction subsample.
    intervened
        Optional cells × genes boolean matrix (dense or sparse): True where the gene was intervened on in that
        cell (e.g. knocked out). Its own equation's terms are left out of the loss for those cells (see
        :meth:`VariationalNotears.forward`), as SDCD and DCD-FG do; its value still drives its children.
    candidates
        Optional M×M boolean matrix (dense A only): the edges i → j A may use (True); the others stay 0, as in
        SDCD's screened second stage.
    progress_desc
        Label of the progress bar.
    **options
        Fields of :class:`~cape.causal.NotearsConfig` by name (e.g. ``rank=None, epochs=20``), replacing those of
        ``config``; another name raises :class:`~cape.CapeInputError`.

    Returns
    -------
    CausalFit
    """
    config = with_options(NotearsConfig, config, options, "fit_variational_notears")
    start = time.perf_counter()
    n_cells, n_genes = X.shape
    dev = resolve_device(device) if not isinstance(device, torch.device) else device
    torch.manual_seed(int(seed))
    rng = np.random.default_rng(int(seed))
    h_every = resolve_h_every(config.h_every, n_genes, config.rank)
    rho_max = resolve_rho_max(config.rho_max, config.rank, n_genes)
    data = _Standardised(X, config.standardize, dev)
    Irows = intervention_rows(intervened, n_cells, n_genes)
    model = _build_model(data, config, seed, candidates)
    compiled = _compile_if_worth(model, data, config, n_cells)
    if dev.type == "cpu":  # a step's activations, mapped afresh at every step above glibc's mmap threshold
        keep_freed_blocks(min(config.batch_size, n_cells) * n_genes * max(config.hidden, 1)
                          * next(model.parameters()).element_size())
    recon_fraction = _recon_fraction(config, n_cells, n_genes)
    recon_rows = None if recon_fraction == 1 else max(2, math.ceil(recon_fraction * min(config.batch_size, n_cells)))
    run = _Run(model, config, h_every, _Lagrangian(float(config.rho_init), rho_max), recon_rows, data,
               _Kept(Irows, dev))
    try:
        history, epochs_run, converged = _train(run, rng, progress_desc)
    finally:
        if run.captured is not None:
            run.captured.release()

    model.eval()
    for mlp in (model.encoder_mlp, model.decoder_mlp):
        mlp.compiled = False  # eager kernels from here on: the compiled ones hold the training process's graphs
    with torch.no_grad():
        A = model.adjacency().detach().float().cpu().numpy().copy()
    np.fill_diagonal(A, 0.0)
    peak = max(history["max_weight"], default=0.0)
    message = _collapse_message(model, A, peak, converged, data, rng, config)
    if message:
        logger.warning(message)
    return CausalFit(adjacency=A, history=history, epochs_run=epochs_run, converged=converged and not message,
                     wall_time=time.perf_counter() - start, device=str(dev), rank=config.rank, h_every=h_every,
                     rho_max=rho_max, compiled_mlp=bool(compiled), recon_fraction=float(recon_fraction),
                     cuda_graphs=run.captured is not None and run.captured.captured, model=model,
                     mean=np.asarray(data.mean, dtype=np.float64), std=np.asarray(data.std, dtype=np.float64),
                     collapsed=bool(message), collapse_message=message, peak_weight=float(peak),
                     n_intervened=0 if Irows is None else int(Irows.nnz), sparse=model.sparse)
