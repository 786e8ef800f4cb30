"""The verdict at the top of a run's report: did CAPE do anything, did the transformer beat the same-run
baselines beyond the spread one seed allows, and what each stage cost (time, peak memory).

Each judgement is a small function returning a :class:`Finding` (level, text, remedy), so the wording is tested
on small inputs and the report only lays findings out (markdown for ``report.md``, HTML for Snakemake's report).
"""

from __future__ import annotations

import html
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import anndata as ad
import numpy as np

from .._tables import _inline, html_page, html_table, markdown_table
from ..causal.confidence import MIN_DETECTED_CELLS, SOLID_CONFIDENCE
from ..causal.pair_ranking import PAIR_RANKING_WORDS
from ..causal.postprocess import AUTO_TAU_FLOOR
from ..hyperbolic.hierarchy import MIN_HIERARCHY_SPEARMAN, Hierarchy
from ..pp._recipe import RARE_GENE_CELLS
from .resources import resources_table
from .statistics import LEVEL, N_BOOTSTRAP, Comparison, comparisons_from_records

logger = logging.getLogger("cape")


#: Below this fraction of used genes with a position, the encoding carries little (issue 12's target: half): the
#: verdict says so and names a threshold that would reach it, and a baseline that wins counts it among the causes.
MIN_POSITIONED_FRACTION = 0.5
#: From this share of Step I's edges untested by the edge confidence (a gene varying in a handful of cells), the
#: verdict warns that the graph rests on a few cells' values.
UNTESTED_WARNING_SHARE = 0.5
#: Below this share of Step I's edges solid in the edge confidence, the verdict warns that the graph is mostly
#: guesses: the positions then rest on edges the data do not back.
SOLID_WARNING_SHARE = 0.1


#: Rule of thumb, not a measured threshold: fewer fine-tune cells than this are "few" for a transformer trained
#: from scratch (logistic regression on PCA needs a handful of cells per class).
FEW_FINE_TUNE_CELLS = 1000


#: Rule of thumb, not a measured threshold: below this many scored cells "no clear difference" says little, as the
#: bootstrap interval of an accuracy spans tens of points.
FEW_COMPARED_CELLS = 50


#: Scores at or above this (accuracy, F1, ARI: all at most 1) count as the ceiling: two models that both reach it
#: with an interval within ± (1 − CEILING) cannot be told apart on this data, whichever is better elsewhere.
CEILING = 0.99


#: Encodings of ``cape train`` that use neither the causal graph nor CAPE's positions (see ``cape encodings``).
POSITION_FREE_ENCODINGS = frozenset({"none", "static_absolute", "trainable_absolute"})


OK, WARNING, NO_OP = "ok", "warning", "no-op"


_LABELS = {OK: "OK", WARNING: "Warning", NO_OP: "CAPE did nothing"}


@dataclass(frozen=True)
class Finding:
    """One judgement of the verdict: ``level`` is ``"ok"``, ``"warning"`` or ``"no-op"``."""

    level: str
    topic: str
    text: str
    remedies: tuple[str, ...] = field(default_factory=tuple)
    short: str = ""  # a few words for the headline (warnings and no-ops)

    @property
    def label(self) -> str:
        return _LABELS[self.level]


# ---------------------------------------------------------------------------------------------------- positions
@dataclass(frozen=True)
class Positioning:
    """How many of the genes used by Steps I–III got a position from the causal graph."""

    n_used: int
    n_positioned: int
    n_edges: int | None
    tau: float | None = None
    n_cells: int | None = None
    tau_rule: str | None = None
    #: ``(τ, edges, positioned genes)`` at smaller thresholds (Step I's ``threshold_scan``), strongest τ first
    scan: tuple[tuple[float, int, int], ...] = ()
    #: Where Step II put the genes without an edge (its ``isolated`` option), when recorded
    isolated: str | None = None
    #: How the edge budget chose its pairs (``edge_budget["pair_ranking"]``): under a pair ranking other than
    #: ``"fit"`` ``tau`` is the lightest kept weight, not a cut of A
    pair_ranking: str | None = None
    #: Gene pairs the edge budget kept (``edge_budget["n_pairs"]``: those significant at its false discovery rate,
    #: less the permuted copy's), where the budget sized the graph
    budget_pairs: int | None = None
    #: Where the edge budget tested the gene pairs and found none significant (beyond its permuted copy's), so that
    #: Step I fell back on the τ "auto" rule: what the test found, in words; else ``None``
    weak_evidence: str | None = None
    #: Edges the edge confidence could not test (``edge_confidence["n_untested"]``): mostly a gene that varies in fewer
    #: than ``min_detected_cells`` cells
    n_untested: int = 0
    min_detected_cells: int = MIN_DETECTED_CELLS
    #: Edges at confidence ≥ SOLID_CONFIDENCE (``edge_confidence["n_solid"]``); ``None`` without the confidence
    n_solid: int | None = None

    @property
    def fraction(self) -> float:
        return self.n_positioned / self.n_used if self.n_used else 0.0


def positioning(adata: ad.AnnData) -> Positioning | None:
    """Genes of ``var["cape_used"]`` (all genes when absent) with at least one edge in the causal graph.

    The graph is the one Step II embedded (``var["cape_connected"]``) when present, else ``varp["cape_dag"]``.
    ``None`` when the AnnData has neither (Steps I–II were not run).
    """
    used = (adata.var["cape_used"].to_numpy(dtype=bool) if "cape_used" in adata.var
            else np.ones(adata.n_vars, dtype=bool))
    n_edges = None
    has_edge = None
    if "cape_dag" in adata.varp:
        nonzero = adata.varp["cape_dag"] != 0
        n_edges = int(nonzero.sum())
        has_edge = (np.asarray(nonzero.sum(axis=0)).ravel() + np.asarray(nonzero.sum(axis=1)).ravel()) > 0
    if "cape_connected" in adata.var:
        has_edge = adata.var["cape_connected"].to_numpy(dtype=bool)
    elif "cape_embedded" in adata.var:  # files written before Step II embedded genes without an edge
        has_edge = adata.var["cape_embedded"].to_numpy(dtype=bool)
    if has_edge is None:
        return None
    info = adata.uns.get("cape", {}).get("causal_graph", {})
    # τ actually applied: "auto" is calibrated by Step I and recorded as tau_used
    tau = info.get("tau_used", info.get("params", {}).get("tau"))
    n_cells = info.get("n_cells")
    scan = info.get("threshold_scan", {})
    rows = tuple((float(t), int(e), int(p)) for t, e, p in
                 zip(scan.get("tau", ()), scan.get("n_edges", ()), scan.get("n_positioned", ()), strict=False))
    isolated = adata.uns.get("cape", {}).get("hyperbolic_embedding", {}).get("params", {}).get("isolated")
    budget = info.get("edge_budget") or {}
    budget_pairs = budget.get("n_pairs") if info.get("tau_rule") == "budget" else None
    weak = _weak_evidence(budget) if str(info.get("tau_rule", "")).startswith("auto") else None
    confidence = info.get("edge_confidence") or {}
    return Positioning(n_used=int(used.sum()), n_positioned=int((has_edge & used).sum()), n_edges=n_edges,
                       tau=float(tau) if isinstance(tau, int | float | np.number) else None,
                       n_cells=None if n_cells is None else int(n_cells),
                       tau_rule=info.get("tau_rule"), scan=rows,
                       isolated=None if isolated is None else str(isolated),
                       pair_ranking=budget.get("pair_ranking"),
                       budget_pairs=None if budget_pairs is None else int(budget_pairs), weak_evidence=weak,
                       n_untested=int(confidence.get("n_untested", 0)),
                       n_solid=None if confidence.get("n_solid") is None else int(confidence["n_solid"]),
                       min_detected_cells=int(confidence.get("min_detected_cells", MIN_DETECTED_CELLS)))


def _weak_evidence(budget: dict) -> str | None:
    """What the edge budget's test found where it tested the pairs and kept none (``n_pairs`` 0), in words."""
    if budget.get("n_pairs") != 0 or "n_pairs_significant" not in budget:
        return None
    fill = "n_pairs_significant_fill" in budget  # nothing passed at either rate: the looser one's count
    significant = int(budget["n_pairs_significant_fill" if fill else "n_pairs_significant"])
    permuted = int(budget.get("n_pairs_permuted_fill" if fill else "n_pairs_permuted", 0))
    found = ("no gene pair with a significant partial correlation" if not significant else
             f"{significant:,} gene pair(s) with a significant partial correlation, no more than the {permuted:,} it "
             "found on a copy of the cells with every gene permuted")
    rate = float(budget["fill_fdr"] if fill else budget.get("fdr", 0.05))
    return (f"{found} (FDR {rate:g}, {int(budget.get('n_cells_tested', 0)):,} cells, "
            f"{int(budget.get('n_pairs_tested', 0)):,} pairs tested)")


def tau_remedy(pos: Positioning) -> str | None:
    """A smaller Step I threshold that Step I's own scan shows would help, or ``None`` where none would.

    Only thresholds at or above the noise floor :data:`~cape.causal.postprocess.AUTO_TAU_FLOOR` count (smaller
    weights are the optimiser's noise, not edges). With some genes positioned, the threshold must reach
    :data:`MIN_POSITIONED_FRACTION` of the used genes; with none, any gene positioned is a change. The largest such
    τ is named, as it keeps the fewest weak edges. Where the edge budget sized the graph, the advice says how many
    of those edges go beyond the pairs the budget found significant: a fixed τ takes them on the fit's word alone.
    """
    lower = [(t, e, p) for t, e, p in pos.scan
             if t >= AUTO_TAU_FLOOR - 1e-12 and (pos.tau is None or t < pos.tau) and p > pos.n_positioned]
    need = MIN_POSITIONED_FRACTION * pos.n_used
    enough = [r for r in lower if r[2] >= need]
    if not enough and pos.n_positioned == 0 and lower:
        enough = [max(lower, key=lambda r: (r[2], r[0]))]
    if not enough:
        return None
    t, e, p = max(enough, key=lambda r: r[0])
    now = f"; this run: τ = {pos.tau:.3g}" if pos.tau is not None else ""
    beyond = ""
    if pos.budget_pairs is not None and e > pos.budget_pairs:
        beyond = (f", but only {pos.budget_pairs:,} gene pairs were significant at the edge budget's false discovery "
                  f"rate: the other {e - pos.budget_pairs:,} edges rest on the fit's weights alone, so their "
                  "positions are guesses")
    return (f"lower Step I's edge threshold to `causal.tau: {t:.3g}`: Step I's threshold scan keeps {e:,} edges "
            f"there, positioning {p:,} of the {pos.n_used:,} genes{beyond}{now}")


def positions_remedies(pos: Positioning) -> tuple[str, ...]:
    """What would position more genes: a threshold the scan supports (:func:`tau_remedy`); else, where Step I
    recorded a scan that shows none, more cells (more power for every edge test); else nothing."""
    tau = tau_remedy(pos)
    if tau is not None:
        return (tau,)
    if not pos.scan:
        return ()  # no scan recorded: nothing to check a remedy against
    cells = f" (this run: {pos.n_cells:,})" if pos.n_cells is not None else ""
    return (f"more cells{cells}: no smaller threshold down to the noise floor τ {AUTO_TAU_FLOOR:g} positions enough "
            "genes (Step I's threshold scan), so the graph holds what these cells support",)


def rare_genes_remedy(pos: Positioning) -> tuple[str, ...]:
    """``preprocess.min_cells`` where at least :data:`UNTESTED_WARNING_SHARE` of the edges join a gene too rarely
    detected to test (their genes' pairs are also left out of the edge budget's robust test); else nothing."""
    if not pos.n_edges or pos.n_untested < UNTESTED_WARNING_SHARE * pos.n_edges:
        return ()
    return (f"`preprocess.min_cells: {RARE_GENE_CELLS}`: the genes used are then chosen among those detected in at "
            f"least {RARE_GENE_CELLS} cells, whose edges and pairs Step I can test ({pos.n_untested:,} of this run's "
            f"{pos.n_edges:,} edges could not be)",)


def positioning_finding(pos: Positioning | None, encoding: str | None = None) -> Finding:
    """No-op when no gene got a position, a warning below :data:`MIN_POSITIONED_FRACTION`, else OK.

    ``encoding``: the transformer's positional encoding, when known; one that ignores the graph is named.
    """
    ignores = (f" (This run's transformer used the '{encoding}' encoding, which does not use the causal graph.)"
               if encoding in POSITION_FREE_ENCODINGS else "")
    if pos is None:
        return Finding(WARNING, "positions", "This data has no causal graph (Steps I–II were not run), so the "
                       "transformer had no CAPE positions.", ("run `cape causal` and `cape embed` first",),
                       short="no causal graph")
    edges = ("no edges" if pos.n_edges == 0 else "1 edge" if pos.n_edges == 1
             else f"{pos.n_edges:,} edges" if pos.n_edges is not None else "a graph")
    spread = pos.isolated == "negatives"  # Step II spreads genes without an edge apart instead of centring them
    if pos.n_positioned == 0 and spread:
        return Finding(NO_OP, "positions",
                       f"The causal graph has {edges} among the {pos.n_used:,} genes used, so no gene's position "
                       "carries causal information: Step II only spread the genes apart, and CAPE's angles are "
                       "those of distinct but arbitrary positions"
                       + (f".{ignores}" if ignores else ", so the transformer's results say nothing about the "
                          "causal graph."),
                       positions_remedies(pos), short="no gene got a causal position")
    if pos.n_positioned == 0:
        return Finding(NO_OP, "positions",
                       f"The causal graph has {edges} among the {pos.n_used:,} genes used, so every gene sits at "
                       "the centre of the Poincaré disk and gets a rotation angle of 0: CAPE changed nothing"
                       + (f".{ignores}" if ignores else ", and the transformer's results are those of a model "
                          "without positional information."),
                       positions_remedies(pos), short="no gene got a position, so CAPE changed nothing")
    share = f"{pos.fraction:.0%} of the genes used ({pos.n_positioned:,} of {pos.n_used:,})"
    weights = " with weights down to" if pos.pair_ranking in PAIR_RANKING_WORDS else " at τ ="
    at = f"{weights} {pos.tau:.3g}" + (f" ({pos.tau_rule})" if pos.tau_rule else "") if pos.tau is not None else ""
    graph = f"{share.capitalize()} got a position from the causal graph ({edges}{at}), but "
    more_cells = "more cells" + (f" (this run: {pos.n_cells:,})" if pos.n_cells is not None else "")
    if pos.weak_evidence is not None:
        return Finding(WARNING, "positions",
                       f"{graph}Step I's edge budget found {pos.weak_evidence}: these edges are the fit's heaviest "
                       "weights, kept by the τ 'auto' rule without support from the test, so read the graph and the "
                       "positions as guesses." + ignores,
                       (f"{more_cells}: the test's power grows with them", *rare_genes_remedy(pos)),
                       short="Step I's graph rests on weak evidence")
    if pos.n_edges and pos.n_untested >= UNTESTED_WARNING_SHARE * pos.n_edges:
        return Finding(WARNING, "positions",
                       f"{graph}{pos.n_untested:,} of the edges join a gene that varies in fewer than "
                       f"{pos.min_detected_cells} cells: a dependence there is a few cells' values, which no test can "
                       "back, so read those edges and the positions they give as guesses." + ignores,
                       rare_genes_remedy(pos), short="most of Step I's edges join genes seen in a handful of cells")
    if pos.n_edges and pos.n_solid is not None and pos.n_solid < SOLID_WARNING_SHARE * pos.n_edges:
        solid = ("none of them is solid" if pos.n_solid == 0 else
                 f"only {pos.n_solid:,} of them {'is' if pos.n_solid == 1 else 'are'} solid")
        return Finding(WARNING, "positions",
                       f"{graph}{solid} (confidence ≥ {SOLID_CONFIDENCE}: the dependence holds given the child's "
                       "other parents and the cells' state): the positions rest on edges the data do not back, so "
                       "read the graph and the positions as guesses." + ignores,
                       (f"{more_cells}: the edge test's power grows with them",),
                       short="few of Step I's edges are solid")
    if pos.fraction < MIN_POSITIONED_FRACTION:
        # Not a warning by itself: the transformer still reads every gene (a token with its expression), and the
        # genes without a position are encoded as a model without positions would encode them. It becomes one
        # where a baseline wins (likely_causes) or where no gene has a position (above).
        others = ("Step II spread the others apart, so their positions carry no causal information" if spread
                  else "the others sit at the centre of the Poincaré disk (rotation angle 0)")
        text = (f"{share.capitalize()} got a position from the causal graph ({edges}{at}); {others}. The transformer "
                "still reads every gene's expression: CAPE's causal positions act on the positioned genes only."
                + ignores)
        remedy = tau_remedy(pos)
        return Finding(OK, "positions", text, () if remedy is None else (remedy,),
                       short=f"{pos.fraction:.0%} of the genes got a position")
    return Finding(OK, "positions", f"{share.capitalize()} got a position from the causal graph ({edges}{at})."
                   + ignores)


@dataclass(frozen=True)
class Training:
    """What the transformer learnt from: fine-tune cells, masked pretraining epochs, published weights."""

    n_fine_tune: int | None
    pretrain_epochs: int
    pretrained_weights: bool
    architecture: str | None = None
    encoding: str | None = None

    @property
    def name(self) -> str:
        """"the transformer (scGPT + CAPE)", or just "the transformer" when the model is not recorded."""
        if self.architecture is None:
            return "the transformer"
        arch = {"scgpt": "scGPT", "scbert": "scBERT"}.get(self.architecture, self.architecture)
        enc = {"cape": "CAPE", None: "?"}.get(self.encoding, self.encoding)
        return f"the transformer ({arch} + {enc})"


def training_context(adata: ad.AnnData, split_key: str = "cape_split") -> Training:
    """From ``obs[split_key]`` and ``uns["cape"]["model"]`` as ``cape train`` leaves them."""
    n_ft = int((adata.obs[split_key].astype(str) == "fine_tune").sum()) if split_key in adata.obs else None
    model = adata.uns.get("cape", {}).get("model", {})
    history = model.get("history", {}).get("pretrain", {})
    epochs = len(next(iter(history.values()))) if history else 0
    # A model built from a published scGPT checkpoint records its folder ("checkpoint"); older runs only show it
    # through strict_genes=False, which CellTransformer.from_scgpt alone sets.
    pretrained = bool(model.get("checkpoint")) or model.get("strict_genes") is False
    encoding = model.get("backbone", {}).get("encoding")
    return Training(n_ft, epochs, pretrained, model.get("architecture"), encoding)


_NAMES = {"cape": "the transformer", "logreg_pca": "logistic regression on PCA", "pca_kmeans": "k-means on PCA",
          "cape_fine_tuned": "the fine-tuned transformer (its embedding has seen the fine-tune cells' labels; "
                             "k-means on PCA has not)"}


def likely_causes(training: Training, pos: Positioning | None, *, labels_seen: bool = True) -> list[tuple[str, str]]:
    """(cause, remedy) pairs for a baseline beating the transformer, most likely first. ``labels_seen=False``: the
    result is that of an embedding made before fine-tuning (clustering), which no label has shaped."""
    causes = []
    if not training.pretrained_weights and not labels_seen:
        pre = (f"{training.pretrain_epochs} epochs of self-supervised pretraining" if training.pretrain_epochs
               else "no pretraining")
        causes.append((f"a transformer trained from scratch without labels: its cell embedding comes from {pre} on "
                       "this run's cells, while PCA finds the main axes of variation at once",
                       "start from published weights with `train.checkpoint: path/to/scGPT_folder`; or pretrain "
                       f"longer (`train.pretrain_epochs`, now {training.pretrain_epochs}); or give more cells"))
    elif not training.pretrained_weights:
        cells = f"{training.n_fine_tune:,} labelled cells" if training.n_fine_tune is not None else "this run's cells"
        pre = (f"{training.pretrain_epochs} epochs of self-supervised pretraining" if training.pretrain_epochs
               else "no pretraining")
        few = training.n_fine_tune is not None and training.n_fine_tune < FEW_FINE_TUNE_CELLS
        what = "too few cells to train a transformer from scratch" if few else "a transformer trained from scratch"
        cause = f"{what}: it learnt from {cells} with {pre}, while a linear model on PCA needs a few cells per class"
        pretrain = ("or pretrain on all cells first (`train.pretrain_epochs`, now 0)" if not training.pretrain_epochs
                    else f"or pretrain longer (`train.pretrain_epochs`, now {training.pretrain_epochs})")
        remedy = ("start from published weights with `train.checkpoint: path/to/scGPT_folder`; or give more cells; "
                  + pretrain)
        causes.append((cause, remedy))
    if training.encoding in POSITION_FREE_ENCODINGS:
        pass  # the positions cannot explain anything: the encoding does not read them
    elif pos is not None and pos.n_positioned == 0:
        causes.append(("no gene got a causal position: the encoding added nothing causal" if
                       pos.isolated == "negatives" else "no gene got a position: the encoding added nothing",
                       "; or ".join(positions_remedies(pos))))
    elif pos is not None and pos.fraction < MIN_POSITIONED_FRACTION:
        causes.append((f"few genes positioned ({pos.fraction:.0%}): the encoding adds little",
                       "; or ".join(positions_remedies(pos))))
    if not causes:
        causes.append(("the model may be too small or stopped too early for this data",
                       "raise `train.epochs`, `train.d_model` or `train.n_layers`"))
    return causes


def comparison_finding(cmp: Comparison, causes: Sequence[tuple[str, str]] = (), *,
                       method_name: str | None = None) -> Finding:
    """A warning when the 95 % interval of (method − baseline) lies below 0, else an OK that says what is known."""
    method = method_name or _NAMES.get(cmp.method, cmp.method)
    baseline = _NAMES.get(cmp.baseline, cmp.baseline)
    scores = (f"{cmp.metric} {cmp.value:.2f} for {method} against {cmp.baseline_value:.2f} for {baseline} "
              f"(difference {cmp.diff:+.2f}; {LEVEL:.0%} bootstrap interval over the {cmp.n_cells:,} "
              f"{'test ' if cmp.task == 'annotation' else ''}cells {cmp.low:+.2f} to {cmp.high:+.2f})")
    task = {"annotation": "Cell-type annotation", "clustering": "Clustering"}.get(cmp.task, cmp.task)
    if cmp.high < 0:
        text = f"{task}: the simple baseline is better, by more than the variation between cells explains — {scores}."
        if causes:
            text += " Likely cause: " + "; or ".join(c for c, _ in causes) + "."
        return Finding(WARNING, cmp.task, text, tuple(r for _, r in causes if r),
                       short=f"{baseline} beats the transformer on {task.lower()}")
    if cmp.low > 0:
        return Finding(OK, cmp.task, f"{task}: {method} is better than {baseline}, by more than the variation "
                       f"between cells explains — {scores}.")
    if min(cmp.value, cmp.baseline_value) >= CEILING and max(abs(cmp.low), abs(cmp.high)) <= 1 - CEILING:
        return Finding(WARNING, cmp.task, f"{task}: {method} and {baseline} both score at the ceiling, so the data are "
                       f"too easy to separate them — {scores}.",
                       ("compare on a harder task: finer labels (`labels:` a finer obs column) or harder data",),
                       short=f"both at the ceiling on {task.lower()}, so no comparison")
    if cmp.n_cells < FEW_COMPARED_CELLS:
        return Finding(WARNING, cmp.task, f"{task}: too few cells to tell {method} from {baseline} — {scores}.",
                       ("label more cells: the comparison is scored on the labelled cells not used for fine-tuning",),
                       short=f"too few cells to compare on {task.lower()}")
    return Finding(OK, cmp.task, f"{task}: no clear difference (within the variation between cells) — {scores}.")


def resources_finding(rows: Sequence[dict]) -> Finding:
    """Which stage took longest and which needed the most memory; says how many stages were not measured."""
    timed = [r for r in rows if r["seconds"] is not None]
    sized = [r for r in rows if r["max_rss_mb"] is not None]
    if not timed and not sized:
        return Finding(OK, "resources", "Time and memory were not measured (run through Snakemake, or give "
                       "`cape evaluate --benchmarks logs/<run>`).")
    parts = []
    if timed:
        slow = max(timed, key=lambda r: r["seconds"])
        parts.append(f"{sum(r['seconds'] for r in timed):,.0f} s in all, the longest stage {slow['stage']} "
                     f"({slow['seconds']:,.0f} s)")
    if sized:
        big = max(sized, key=lambda r: r["max_rss_mb"])
        parts.append(f"the largest peak memory {big['stage']} ({big['max_rss_mb']:,.0f} MB)")
    missing = [r["stage"] for r in rows if r["seconds"] is None and r["max_rss_mb"] is None]
    text = "Resources: " + ", ".join(parts) + "."
    if missing:
        text += f" Not measured: {', '.join(missing)}."
    return Finding(OK, "resources", text)


def cells_finding(adata: ad.AnnData) -> Finding | None:
    """A warning when Step I had fewer cells than genes (it warns in its log, which few users read); else ``None``."""
    info = adata.uns.get("cape", {}).get("causal_graph", {})
    n_cells, n_genes = info.get("n_cells"), info.get("n_genes")
    if n_cells is None or n_genes is None or int(n_cells) >= int(n_genes):
        return None
    return Finding(WARNING, "cells", f"Step I learnt the graph from {int(n_cells):,} cells for {int(n_genes):,} "
                   "genes: with fewer cells than genes the graph is poorly determined, and many of its edges may be "
                   "noise.", ("give Step I more cells, or fewer genes (`preprocess.n_top_genes`)",),
                   short="fewer cells than genes in Step I")


def hierarchy_finding(adata: ad.AnnData) -> Finding | None:
    """A warning when Step II's norms do not order the genes with an edge by generality (the record's
    ``hierarchy_spearman`` below :data:`~cape.hyperbolic.hierarchy.MIN_HIERARCHY_SPEARMAN`, or undefined); else
    ``None`` (also for files written before the measurement was recorded, and for graphs without an edge)."""
    info = adata.uns.get("cape", {}).get("hyperbolic_embedding", {})
    if "hierarchy_spearman" not in info or not int(info.get("hierarchy_n_genes", 0)):
        return None
    hierarchy = Hierarchy(float(info["hierarchy_spearman"]), int(info["hierarchy_n_genes"]))
    per_anchor = str(info.get("params", {}).get("positive_weight", "")).endswith("/anchor_sum")
    if not hierarchy.missing:
        return None
    rho = (f"Spearman(generality, −norm) = {hierarchy.spearman:.2f}" if np.isfinite(hierarchy.spearman)
           else "Spearman(generality, −norm) is undefined")
    return Finding(WARNING, "hierarchy",
                   f"Step II's positions do not follow the graph's hierarchy: {rho} over the "
                   f"{hierarchy.n_genes:,} genes with an edge (general genes should sit near the centre of the "
                   f"Poincaré disk; below {MIN_HIERARCHY_SPEARMAN:.1f} they do not). CAPE's encoding then gives "
                   "these genes distinct positions, an identity, not a causal hierarchy."
                   + (" `embed.positive_weights: per_anchor` (Step II's option that keeps hubs nearer the centre) "
                      "may help." if not per_anchor else ""),
                   short="Step II's positions show no causal hierarchy")


# ---------------------------------------------------------------------------------------------------- verdict
def verdict(adata: ad.AnnData, records: Sequence[dict], resources: Sequence[dict] | None = None) -> list[Finding]:
    """Every finding of the verdict, in reading order: positions, Step I's cells, Step II's hierarchy, baselines,
    resources."""
    pos = positioning(adata)
    training = training_context(adata)
    findings = [positioning_finding(pos, training.encoding)]
    findings += [f for f in (cells_finding(adata), hierarchy_finding(adata)) if f is not None]
    comparisons = comparisons_from_records(records)
    if comparisons:
        causes = likely_causes(training, pos)
        unsupervised = likely_causes(training, pos, labels_seen=False)  # clustering of the pretrained embedding
        findings += [comparison_finding(c, unsupervised if (c.task, c.method) == ("clustering", "cape") else causes,
                                        method_name=training.name if c.method == "cape" else None)
                     for c in comparisons]
    elif not any(r["task"] in ("annotation", "clustering") for r in records):
        findings.append(Finding(OK, "baselines", "No cell labels, so the transformer was not compared with "
                                "baselines (give `labels: <obs column>` in the config, or `--label-key`)."))
    if resources is not None:
        findings.append(resources_finding(resources))
    return findings


def headline(findings: Sequence[Finding]) -> str:
    """One sentence over all findings: what went wrong, or that nothing did."""
    if any(f.level == NO_OP and f.short == "no gene got a causal position" for f in findings):
        return ("CAPE did nothing causal in this run: no gene got a position from the causal graph, so read the "
                "numbers below as those of a transformer with arbitrary gene positions.")
    if any(f.level == NO_OP for f in findings):
        return ("CAPE did nothing in this run: no gene got a position from the causal graph, so read the numbers "
                "below as those of a transformer without positional encoding.")
    problems = [f.short or f.topic for f in findings if f.level != OK]
    if not problems:
        positions = next((f.short for f in findings if f.topic == "positions" and f.short), "most genes got a position")
        if not any(f.topic in ("annotation", "clustering") for f in findings):
            # Without labels nothing was compared: the headline must not claim that the baselines lost.
            return (f"No problems found: {positions}; without cell labels the transformer was not compared with "
                    "baselines.")
        return (f"No problems found: {positions}, and no baseline beats the transformer by more than the variation "
                "between cells.")
    return "Read with care: " + "; ".join(problems) + "."


def _with_new_remedies(findings: Sequence[Finding]) -> list[tuple[Finding, list[str]]]:
    """Each finding with the remedies not already given for an earlier one."""
    seen: set[str] = set()
    out = []
    for f in findings:
        out.append((f, [r for r in f.remedies if r not in seen]))
        seen.update(f.remedies)
    return out


def verdict_markdown(findings: Sequence[Finding], resources: Sequence[dict] | None = None) -> str:
    """The verdict section of report.md: a headline, one bullet per finding with its remedies, the resources."""
    lines = ["## Verdict", "", f"**{headline(findings)}**", ""]
    for f, remedies in _with_new_remedies(findings):
        lines.append(f"- **{f.label}** — {f.text}")
        lines += [f"  - What to do: {r}" for r in remedies]
    if any(f.topic in ("annotation", "clustering") for f in findings):
        lines += ["", f"_The intervals resample the cells scored ({N_BOOTSTRAP:,} times); they do not include the "
                  "variation between training seeds (one run, one seed). `cape-bench encodings` repeats over seeds._"]
    if resources:
        header, rows = resources_table(resources)
        lines += ["", "Time and peak resident memory per stage (Snakemake samples memory every few seconds, so "
                  "very short peaks can be missed; `evaluate` measures its own peak):", "",
                  markdown_table(header, rows)]
    return "\n".join(lines)


def verdict_html(findings: Sequence[Finding], resources: Sequence[dict] | None = None,
                 title: str = "Verdict") -> str:
    """The same verdict as a self-contained HTML page (for Snakemake's report)."""
    colour = {OK: "#1b7837", WARNING: "#b35806", NO_OP: "#b2182b"}
    items = []
    for f, remedies in _with_new_remedies(findings):
        rem = "".join(f"<li>What to do: {_inline(r)}</li>" for r in remedies)
        items.append(f'<li><b style="color:{colour[f.level]}">{html.escape(f.label)}</b> — {_inline(f.text)}'
                     + (f"<ul>{rem}</ul>" if rem else "") + "</li>")
    body = f"<h2>{html.escape(title)}</h2><p><b>{_inline(headline(findings))}</b></p><ul>{''.join(items)}</ul>"
    if resources:
        header, rows = resources_table(resources)
        body += "<h3>Time and peak memory per stage</h3>" + html_table(header, rows)
    return html_page(title, body)
