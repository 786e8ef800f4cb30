"""Step I: the causal gene graph (variational NOTEARS with exact dense or low-rank acyclicity).

Torch cores only (no AnnData): :func:`learn_causal_graph` runs Step I's pipeline on a matrix;
:func:`cape.tl.causal_graph` is the AnnData-facing tool over it.
"""

from __future__ import annotations

from .acyclicity_penalty import (
    LinearisedAcyclicity,
    acyclicity,
    acyclicity_dense,
    acyclicity_low_rank,
    acyclicity_power_series,
    acyclicity_weights,
    hadamard_square_factors,
    trace_expm,
)
from .causal_config import CausalConfig, NotearsConfig
from .confidence import SOLID_CONFIDENCE, EdgeConfidence, cell_states, edge_confidence, edge_order, edge_tests
from .equivalence import cpdag, equivalence_class_effects, intervene_equivalence_class, local_parent_sets
from .intervention_orientation import Orientation, descendant_evidence, orient_by_shifts, shift_tests
from .model import ElementwiseMLP, VariationalNotears
from .pair_ranking import (
    PAIR_RANKING,
    PAIR_RANKINGS,
    consensus_scores,
    pair_ranking_for,
    ranked_pairs,
    shrunk_partial_correlations,
    top_pairs_oriented,
)
from .parents_mlp import ParentsMLP, ParentsMLPConfig, fit_parents_mlp
from .pipeline import CausalGraph, learn_causal_graph
from .postprocess import (
    BUDGET_CELLS,
    BUDGET_FDR,
    BUDGET_TEST,
    BUDGET_TESTS,
    budget_rows,
    budget_tests,
    decoy_count,
    edge_budget,
    is_dag,
    make_dag,
    partial_correlation_tests,
    partial_correlations,
    permuted_genes,
    positioned_genes,
    robust_partial_correlation_tests,
    screen_candidates,
    state_partial_correlation_tests,
    tau_for_edges,
    tau_positioning,
    threshold,
)
from .structural_equations import (
    StructuralEquations,
    descendants,
    intervene,
    learned_equations,
    linear_equations,
    topological_order,
)
from .trainer import MIN_CELLS, CausalFit, fit_variational_notears, gene_moments

__all__ = [
    "BUDGET_CELLS",
    "BUDGET_FDR",
    "BUDGET_TEST",
    "BUDGET_TESTS",
    "MIN_CELLS",
    "PAIR_RANKING",
    "PAIR_RANKINGS",
    "SOLID_CONFIDENCE",
    "CausalConfig",
    "CausalFit",
    "CausalGraph",
    "EdgeConfidence",
    "ElementwiseMLP",
    "LinearisedAcyclicity",
    "NotearsConfig",
    "Orientation",
    "ParentsMLP",
    "ParentsMLPConfig",
    "StructuralEquations",
    "VariationalNotears",
    "acyclicity",
    "acyclicity_dense",
    "acyclicity_low_rank",
    "acyclicity_power_series",
    "acyclicity_weights",
    "budget_rows",
    "budget_tests",
    "cell_states",
    "consensus_scores",
    "cpdag",
    "decoy_count",
    "descendant_evidence",
    "descendants",
    "edge_budget",
    "edge_confidence",
    "edge_order",
    "edge_tests",
    "equivalence_class_effects",
    "fit_parents_mlp",
    "fit_variational_notears",
    "gene_moments",
    "hadamard_square_factors",
    "intervene",
    "intervene_equivalence_class",
    "is_dag",
    "learn_causal_graph",
    "learned_equations",
    "linear_equations",
    "local_parent_sets",
    "make_dag",
    "orient_by_shifts",
    "pair_ranking_for",
    "partial_correlation_tests",
    "partial_correlations",
    "permuted_genes",
    "positioned_genes",
    "ranked_pairs",
    "robust_partial_correlation_tests",
    "screen_candidates",
    "shift_tests",
    "shrunk_partial_correlations",
    "state_partial_correlation_tests",
    "tau_for_edges",
    "tau_positioning",
    "threshold",
    "top_pairs_oriented",
    "topological_order",
    "trace_expm",
]
