"""Options of Step I, grouped as the models group theirs (:class:`~cape.models.NetworkConfig`, ``TrainingPlan``).

:class:`CausalConfig` is Step I as a user sets it — in :func:`cape.tl.causal_graph`, ``cape causal`` and the
workflow's ``causal:`` section (whose keys are its fields plus the data selection ``use_genes``, ``layer`` and
``interventions``). :class:`NotearsConfig` is the optimiser of :func:`~cape.causal.fit_variational_notears` in full,
the options a benchmark may change; :meth:`CausalConfig.notears_options` resolves the first into the second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

from .._errors import CapeInputError
from .pair_ranking import PAIR_RANKING, PAIR_RANKINGS
from .postprocess import BUDGET_CELLS, BUDGET_FDR, BUDGET_FILL_FDR, BUDGET_TEST, BUDGET_TESTS

__all__ = ["DENSE_MAX_GENES", "LAMBDA_DENSE", "LAMBDA_LOW_RANK", "LOW_RANK", "MAX_GENE_STEPS", "MODELS", "SCREENS",
           "STANDARDIZE", "CausalConfig", "NotearsConfig", "check_tau"]

#: Step I models: the paper's variational NOTEARS (low-rank, scales to whole transcriptomes), the nonlinear-parents
#: SEM (:mod:`cape.causal.parents_mlp`; gene panels) and the paper's settings exactly (rank 40, λs 1).
MODELS = ("variational", "parents_mlp", "paper")
#: ``screen`` values: candidate parents from partial correlations (dense A), or none.
SCREENS = ("partial_correlation", "none")
#: ``standardize`` values of :class:`NotearsConfig` (``True``/``False`` stand for ``"gene"``/``"none"``).
STANDARDIZE = ("gene", "none")
#: ``rank="auto"``: a dense A up to this many genes, A = UVᵀ of rank :data:`LOW_RANK` above. One epoch of 2,000 cells on
#: one CPU thread took, dense vs rank 40: 0.6 vs 0.4 s at 200 genes, 1.0 vs 0.9 s at 500, 2.1 vs 1.5 s at 1,000 and
#: 8.3 vs 2.5 s at 2,000 (docs/benchmarks/step1_counts.md).
DENSE_MAX_GENES = 1000
LOW_RANK = 40
#: ``lambda_sparse=None``: λs for a dense A (measured on count data, see the docs page) and for A = UVᵀ (the paper's).
LAMBDA_DENSE = 0.3
LAMBDA_LOW_RANK = 1.0
#: ``max_steps="auto"``: a fit takes at most this many gene-steps, i.e. ⌈MAX_GENE_STEPS / genes⌉ AdamW steps (2,500
#: at 2,000 genes), epochs cut to fit but never below ``min_epochs``. A step's time grows with the genes and an epoch's
#: steps with the cells, so this bounds the time of a fit on many genes and many cells; panels of fewer genes keep their
#: epochs (Sachs's 11 proteins over 7,466 cells lose edges when cut to 2,500 steps; docs/benchmarks/count_panel.md).
MAX_GENE_STEPS = 5_000_000


def _check_max_steps(max_steps) -> None:
    """Refuse a ``max_steps`` that is not a positive integer, ``"auto"`` or ``None``."""
    if not (max_steps is None or max_steps == "auto" or (_is_int(max_steps) and max_steps >= 1)):
        raise CapeInputError(f"max_steps must be a positive integer, 'auto' or None (epochs alone), got {max_steps!r}")


def _is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def check_tau(tau) -> float | str:
    """``tau`` as ``"budget"``, ``"auto"`` or a float in [0, 1); anything else raises :class:`~cape.CapeInputError`."""
    if isinstance(tau, str) and tau.strip().lower() in ("auto", "budget"):
        return tau.strip().lower()
    if _is_number(tau) and 0.0 <= tau < 1.0:
        return float(tau)
    raise CapeInputError(f"tau must be a number in [0, 1), 'budget' or 'auto', got {tau!r}")


@dataclass(frozen=True)
class CausalConfig:
    """Step I's options: the model, its size and sparsity, the threshold and the training.

    Attributes
    ----------
    model
        ``"variational"`` (default): the paper's variational NOTEARS, linear in a learnt per-gene feature space, for
        any number of genes. ``"parents_mlp"``: each gene an MLP of all its candidate parents, fitted in SDCD's two
        stages (:mod:`cape.causal.parents_mlp`; gene panels with at least 10·(genes − 1) cells); ``rank``,
        ``epochs``, ``batch_size``, ``lr`` and ``h_every`` do not apply to it, and ``lambda_sparse`` multiplies its L1
        prices. ``"paper"``: the paper's Step I exactly (rank 40 and λs = 1 unless given; set ``tau=0.2`` for its
        threshold).
    rank
        Rank r of A = UVᵀ. ``"auto"`` (default): a dense A, restricted to the screened candidate parents (``screen``;
        stored as those weights only beyond 1,000 genes); without candidates (the screen off or impossible: fewer
        than genes + 10 cells, more than 10,000 genes) a dense A up to :data:`DENSE_MAX_GENES` genes and rank
        :data:`LOW_RANK` above. ``model="paper"``: always 40. ``None``, or r ≥ the number of genes, uses a dense A.
    tau
        Edge threshold τ ∈ [0, 1): ``|A_ij| ≤ τ`` is dropped (the paper uses 0.2), or a rule. ``"budget"`` (default):
        keep as many edges as the data support, the number K of gene pairs whose partial correlation given all other
        genes is significant (``budget_test``, Benjamini–Hochberg at ``budget_fdr``,
        :func:`cape.causal.edge_budget`) less those the same test calls with every gene permuted over the cells
        (:func:`cape.causal.decoy_count`), chosen by ``pair_ranking``; never weights at or below the noise floor
        0.01. The test needs at least genes + 10 cells (and at most 10,000 genes); otherwise the ``"auto"``
        rule is used, and so it is when no pair is significant (with a warning); the record says so. Under the
        budget the ``min_positioned`` check only warns. ``"auto"``: the paper's 0.2 where it already gives an edge to
        at least ``min_positioned`` of the genes, else the largest τ that does, but not below the noise floor.
    budget_fdr
        Benjamini–Hochberg rate of ``tau="budget"``'s partial-correlation test, in (0, 1); default 0.05
        (:data:`cape.causal.BUDGET_FDR`, chosen on held-out seeds of count simulators written by others). A lower
        rate keeps fewer edges, each better supported. Where fewer pairs than genes pass it, ``budget_fill_fdr``
        raises the budget towards one pair per gene.
    budget_fill_fdr
        Where fewer pairs than genes pass ``budget_fdr`` (net of the permuted copy), the budget takes up to one pair
        per gene from those significant at this looser rate by the budget's test and given the cell states
        (:func:`cape.causal.state_partial_correlation_tests`), net of the permuted copy's
        (:func:`cape.causal.fill_budget`); default 0.2 (:data:`cape.causal.BUDGET_FILL_FDR`). A graph of fewer edges
        than genes cannot give every gene a position; on sparse count data (low depth, strong overdispersion, control
        cells of few programmes) the pairs passing at 5 % are mostly right and many true ones lie just past them,
        while cell types alone make weak partial correlations there that the test given the states does not call
        (docs/benchmarks/count_panel.md). ``None``: the ``budget_fdr`` count alone.
    budget_test
        How ``tau="budget"`` tests a pair (:func:`cape.causal.budget_tests`). ``"both"`` (default): a pair counts
        where Fisher's z and the robust test both call it significant; it held the rate on every null tried.
        ``"fisher"``: Fisher's z on every pair, which assumes one variance per gene; where cell types switch genes
        on and off, or dropout makes a gene's spread change from cell to cell, it calls many pairs of independent
        genes significant, so read its count as an edge budget, not a controlled rate (it keeps more edges, more
        true ones among them on ``simulate_grn_cells`` at 2,000 genes). ``"robust"``: a heteroscedasticity-robust
        (sandwich) test, on the pairs of genes whose variance rests on at least 10 cells each (a gene detected in
        k cells: k; :func:`cape.causal.robust_partial_correlation_tests`); too liberal on genes detected in few
        cells (docs/benchmarks/step1_counts.md, count_panel.md). ``"state"``: Fisher's z with the cell states
        (Leiden clusters, :func:`cape.causal.cell_states`) regressed out of every gene, so that genes which merely
        differ between cell types do not count (:func:`cape.causal.state_partial_correlation_tests`).
    pair_ranking
        Which gene pairs ``tau="budget"`` keeps (:mod:`cape.causal.pair_ranking`). ``"auto"`` (default):
        ``"consensus"`` where the intervention labels name some cell as intervened on, ``"shrunk_partial_correlation"``
        where every cell is observational (:func:`cape.causal.pair_ranking_for`; docs/benchmarks/count_panel.md).
        ``"consensus"``: the K pairs ranked highest by the fit's weight and by their partial correlation together
        (the mean of the two ranks), each in the fit's heavier direction with its weight. ``"fit"``: the K heaviest
        directed weights of the fit alone. ``"shrunk_partial_correlation"``: the K pairs with the largest
        shrunk partial correlation (:func:`cape.causal.shrunk_partial_correlations`: the genes' correlation matrix
        shrunk towards the identity as far as held-out cells support, then inverted), each in the fit's
        heavier direction with its weight. Under both rankings a pair the fit gives no weight above the noise floor
        is passed over for the next one; either way the cycles left are broken afterwards.
    budget_cells
        The most cells ``tau="budget"``'s test counts on: max(``budget_cells``, 10 · genes), drawn at random with
        the fit's seed (:func:`cape.causal.budget_rows`); default 2,000 (:data:`cape.causal.BUDGET_CELLS`, the size
        the rate was chosen at). On many more cells, weak partial correlations between genes without an edge become
        significant and the count grows with the cells rather than with the regulation. ``None``: every cell.
    min_positioned
        Share of the genes that must get an edge: below it ``tau="auto"`` stops with the reason and a fixed τ warns;
        0 turns the check off (and the collapse check with it).
    lambda_sparse
        λs of the L1 penalty (see :func:`~cape.causal.fit_variational_notears`). ``None``: :data:`LAMBDA_DENSE` for a
        dense A, :data:`LAMBDA_LOW_RANK` (the paper's) for A = UVᵀ and for ``model="parents_mlp"``.
    epochs, batch_size, lr
        AdamW training (paper: 100, 128, 3e-3); training stops earlier once h has converged.
    max_steps
        The most AdamW steps: on many cells the epochs are cut to ⌈``max_steps`` / batches per epoch⌉; ``"auto"``
        (default): ⌈:data:`MAX_GENE_STEPS` / genes⌉, but never fewer than ``min_epochs`` (10) epochs; ``None``:
        ``epochs`` alone.
    h_every
        Steps between exact evaluations of the acyclicity penalty, linearised in between; ``None``: automatic (exact
        while the exponential is small, else every 10 steps); 1: always exact.
    screen
        ``"partial_correlation"`` (default): the candidate parents of a dense A are both directions of the gene pairs
        whose partial correlation is significant at 20 % FDR (SDCD-style); ``"none"``: every pair.
    leave_out_targets
        With intervention labels: leave each intervened gene's own equation out of the likelihood for its cells
        (default ``True``; SDCD, DCD-FG), the model of a knock-out or knock-down, which sets the target's level.
        ``False``: every cell enters the fit as observational and the labels only orient (``orient_by_shifts``);
        for drugs that change what a protein does rather than its measured level (Sachs' kinase inhibitors).
    orient_by_shifts
        With intervention labels: after thresholding, turn each kept edge i → j where i's level shifted in the cells
        intervened on j and j's did not shift in those intervened on i (a t-test against the control cells,
        Benjamini–Hochberg at 5 %; :func:`cape.causal.orient_by_shifts`). Default ``True``.
    orient_by_likelihood
        Without intervention labels: after thresholding, turn kept edges round where the Gaussian likelihood of the
        standardised genes rises by more than a likelihood-ratio test at 5 % allows by chance, one turn at a time,
        the graph kept acyclic and its gene pairs unchanged (:func:`cape.causal.orient_by_likelihood`). Default
        ``True``.
    edge_confidence
        Test every kept edge again given the child's other parents and the cells' state (Leiden clusters) and give it
        a confidence, 1 − its q-value, and a size, its partial correlation (:func:`cape.causal.edge_confidence`).
        Default ``True``.
    drop_guesses
        Remove the edges whose confidence stays below :data:`~cape.causal.SOLID_CONFIDENCE` (needs
        ``edge_confidence``): on mixtures of cell types they are mostly pairs that only differ between the types.
        Default ``False``.
    """

    model: str = "variational"
    rank: int | str | None = "auto"
    tau: float | str = "budget"
    budget_fdr: float = BUDGET_FDR
    budget_fill_fdr: float | None = BUDGET_FILL_FDR
    budget_test: str = BUDGET_TEST
    pair_ranking: str = PAIR_RANKING
    budget_cells: int | None = BUDGET_CELLS
    min_positioned: float = 0.5
    lambda_sparse: float | None = None
    epochs: int = 100
    max_steps: int | str | None = "auto"
    batch_size: int = 128
    lr: float = 3e-3
    h_every: int | None = None
    screen: str = "partial_correlation"
    leave_out_targets: bool = True
    orient_by_shifts: bool = True
    orient_by_likelihood: bool = True
    edge_confidence: bool = True
    drop_guesses: bool = False

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise CapeInputError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if not (self.rank is None or self.rank == "auto" or (_is_int(self.rank) and self.rank >= 1)):
            raise CapeInputError(f"rank must be a positive integer, None (dense) or 'auto', got {self.rank!r}")
        object.__setattr__(self, "tau", check_tau(self.tau))
        if not (_is_number(self.budget_fdr) and 0.0 < self.budget_fdr < 1.0):
            raise CapeInputError(f"budget_fdr must be a rate in (0, 1), got {self.budget_fdr!r}")
        fill = self.budget_fill_fdr
        if not (fill is None or (_is_number(fill) and 0.0 < fill < 1.0)):
            raise CapeInputError(f"budget_fill_fdr must be a rate in (0, 1) or None (no fill), "
                                 f"got {self.budget_fill_fdr!r}")
        if self.budget_test not in BUDGET_TESTS:
            raise CapeInputError(f"budget_test must be one of {', '.join(BUDGET_TESTS)}, got {self.budget_test!r}")
        if self.pair_ranking not in PAIR_RANKINGS:
            raise CapeInputError(f"pair_ranking must be one of {', '.join(PAIR_RANKINGS)}, got {self.pair_ranking!r}")
        if not (self.budget_cells is None or (_is_int(self.budget_cells) and self.budget_cells >= 1)):
            raise CapeInputError(f"budget_cells must be a positive number of cells or None (every cell), "
                                 f"got {self.budget_cells!r}")
        if not (_is_number(self.min_positioned) and 0.0 <= self.min_positioned <= 1.0):
            raise CapeInputError(f"min_positioned must be a fraction in [0, 1], got {self.min_positioned!r}")
        if self.lambda_sparse is not None and not (_is_number(self.lambda_sparse) and self.lambda_sparse >= 0):
            raise CapeInputError(f"lambda_sparse must be ≥ 0, got {self.lambda_sparse!r}")
        if not (_is_int(self.epochs) and self.epochs >= 1):
            raise CapeInputError(f"epochs must be a positive integer, got {self.epochs!r}")
        _check_max_steps(self.max_steps)
        if not (_is_int(self.batch_size) and self.batch_size >= 1):
            raise CapeInputError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if not (_is_number(self.lr) and self.lr > 0):
            raise CapeInputError(f"lr must be > 0, got {self.lr!r}")
        if self.h_every is not None and not (_is_int(self.h_every) and self.h_every >= 1):
            raise CapeInputError(f"h_every must be a positive integer or None (automatic), got {self.h_every!r}")
        if self.screen not in SCREENS:
            raise CapeInputError(f"screen must be one of {', '.join(SCREENS)}, got {self.screen!r}")
        for name in ("leave_out_targets", "orient_by_shifts", "orient_by_likelihood", "edge_confidence",
                     "drop_guesses"):
            if not isinstance(getattr(self, name), bool):
                raise CapeInputError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.drop_guesses and not self.edge_confidence:
            raise CapeInputError("drop_guesses needs edge_confidence: the guesses are the edges it scores low")

    def rank_for(self, n_genes: int, screened: bool = False) -> int | None:
        """The rank used on ``n_genes`` genes (``None``: dense A), ``screened``: with candidate parents."""
        if self.model == "parents_mlp" or self.rank is None:
            return None
        if self.rank == "auto":
            rank = LOW_RANK if self.model == "paper" or (n_genes > DENSE_MAX_GENES and not screened) else None
            return None if rank is not None and rank >= n_genes else rank
        return None if self.rank >= n_genes else int(self.rank)

    def lambda_for(self, rank: int | None) -> float:
        """λs used with ``rank`` (see ``lambda_sparse``)."""
        if self.lambda_sparse is not None:
            return float(self.lambda_sparse)
        return LAMBDA_DENSE if rank is None and self.model == "variational" else LAMBDA_LOW_RANK

    def notears_options(self, n_genes: int, screened: bool = False) -> dict:
        """The :class:`NotearsConfig` fields this config sets for a variational fit on ``n_genes`` genes (``rank`` and
        λs resolved; ``screened``: with candidate parents), as keywords of
        :func:`~cape.causal.fit_variational_notears`."""
        rank = self.rank_for(n_genes, screened)
        return {"rank": rank, "lambda_sparse": self.lambda_for(rank), "epochs": self.epochs,
                "max_steps": self.max_steps, "batch_size": self.batch_size, "lr": self.lr, "h_every": self.h_every}


@dataclass(frozen=True)
class NotearsConfig:
    """Options of :func:`~cape.causal.fit_variational_notears`: the SEM, AdamW and the augmented Lagrangian.

    Attributes
    ----------
    rank
        Rank of A = UVᵀ, or ``None`` for a dense A.
    lambda_sparse
        λs of the L1 penalty, which is ``L1_UNIT``·λs·‖A‖₁ (``L1_UNIT`` = 0.1, NOTEARS' customary λ1 for its
        least-squares loss on standardised data, so λs = 1, the paper's value, is the NOTEARS default).
    epochs, batch_size, lr, weight_decay
        AdamW (weight decay on the MLPs only); training stops earlier once h ≤ ``h_tol`` and the epoch loss changed by
        less than ``loss_tol`` (relative), but not before ``min_epochs``.
    max_steps
        The most AdamW steps: the epochs are cut to ⌈``max_steps`` / batches per epoch⌉ where that is fewer (many
        cells); ``"auto"`` (default): ⌈:data:`MAX_GENE_STEPS` / genes⌉, but never fewer than ``min_epochs`` epochs;
        ``None``: ``epochs`` alone.
    hidden
        Width of the element-wise MLPs f and g (0: the linear SEM).
    rho_init, rho_max
        First and largest ρ of the augmented Lagrangian; ``rho_max=None``: 1e8 for a dense A up to 1,000 genes,
        1e4 for A = UVᵀ and for a dense A beyond 1,000 genes (see :mod:`cape.causal.trainer`).
    h_tol, loss_tol, min_epochs
        The stop rule.
    h_every
        Steps between exact acyclicity evaluations, linearised in between; ``None``: automatic.
    dual_every, dual_steps
        An inner solve lasts at least ``dual_every`` epochs and at least ``dual_steps`` Adam steps.
    compile_mlp
        Run the per-gene MLPs through ``torch.compile``; ``None``: on CPU for fits with enough work to repay the
        compiling (``cape.causal.trainer.compiles_by_default``).
    cuda_graphs
        Replay each training step as a CUDA graph (one launch per step instead of one per kernel); ``None``: on CUDA
        whenever the standardised matrix stays on the device; ``False``: kernel by kernel.
    recon_fraction
        Share of each batch's cells the reconstruction term sees, in (0, 1]; ``None``: 1, or 0.25 at scale.
    sample_latent, feature_norm
        Passed to :class:`~cape.causal.VariationalNotears` (``feature_norm``: ``"gene"`` or ``"data"``).
    sparse
        Store a candidate-restricted A as its candidate weights only (same model, cost proportional to the
        candidates); ``None``: beyond 1,000 genes (``cape.causal.trainer.SPARSE_MIN_GENES``).
    standardize
        ``"gene"`` (default: z-score each gene) or ``"none"`` (the matrix as given; ``True``/``False`` are accepted
        for these two).
    """

    rank: int | None = LOW_RANK
    lambda_sparse: float = 1.0
    epochs: int = 100
    max_steps: int | str | None = "auto"
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 1e-2
    hidden: int = 64
    rho_init: float = 1.0
    rho_max: float | None = None
    h_tol: float = 1e-8
    loss_tol: float = 1e-3
    min_epochs: int = 10
    h_every: int | None = None
    dual_every: int = 5
    dual_steps: int = 200
    compile_mlp: bool | None = None
    cuda_graphs: bool | None = None
    recon_fraction: float | None = None
    sample_latent: bool = False
    feature_norm: str = "gene"
    standardize: str | bool = "gene"
    sparse: bool | None = None

    def __post_init__(self) -> None:
        if self.rank is not None and not (_is_int(self.rank) and self.rank >= 1):
            raise CapeInputError(f"rank must be a positive integer or None (dense), got {self.rank!r}")
        if not (_is_number(self.lambda_sparse) and self.lambda_sparse >= 0):
            raise CapeInputError(f"lambda_sparse must be ≥ 0, got {self.lambda_sparse!r}")
        for name in ("epochs", "batch_size"):
            if not (_is_int(getattr(self, name)) and getattr(self, name) >= 1):
                raise CapeInputError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        _check_max_steps(self.max_steps)
        if not (_is_int(self.hidden) and self.hidden >= 0):
            raise CapeInputError(f"hidden must be a whole number ≥ 0, got {self.hidden!r}")
        if not (_is_number(self.lr) and self.lr > 0):
            raise CapeInputError(f"lr must be > 0, got {self.lr!r}")
        if self.rho_max is not None and not (_is_number(self.rho_max) and self.rho_max > 0):
            raise CapeInputError(f"rho_max must be a finite number > 0 (or None: automatic), got {self.rho_max}")
        if self.h_every is not None and not (_is_number(self.h_every) and int(self.h_every) == self.h_every
                                             and self.h_every >= 1):
            raise CapeInputError(f"h_every must be a whole number of steps ≥ 1 (or None: automatic), "
                                 f"got {self.h_every}")
        if self.recon_fraction is not None and not (_is_number(self.recon_fraction) and 0 < self.recon_fraction <= 1):
            raise CapeInputError(f"recon_fraction must be in (0, 1], got {self.recon_fraction}")
        if self.feature_norm not in ("gene", "data"):
            raise CapeInputError(f"feature_norm must be 'gene' or 'data', got {self.feature_norm!r}")
        for name in ("sparse", "cuda_graphs", "compile_mlp"):
            if getattr(self, name) not in (None, True, False):
                raise CapeInputError(f"{name} must be True, False or None (automatic), got {getattr(self, name)!r}")
        if self.standardize not in (*STANDARDIZE, True, False):
            raise CapeInputError(f"standardize must be 'gene' or 'none', got {self.standardize!r}")
