"""``cape causal``: Step I on a file, the causal gene graph into ``varp['cape_dag']``."""

from __future__ import annotations

import argparse

from .._errors import CapeInputError
from .._io import write_h5ad
from ..causal.causal_config import MAX_GENE_STEPS, MODELS, SCREENS, CausalConfig
from ..causal.pair_ranking import PAIR_RANKINGS
from ..causal.postprocess import BUDGET_TESTS
from ..data.user_files import detect_scale
from ..tl._causal_graph import causal_graph
from ._command_io import check_output, positive_int, read_input, tau_value


def _rank(value: str) -> int | str | None:
    if value.lower() in {"dense", "none"}:
        return None
    if value.lower() == "auto":
        return "auto"
    try:
        rank = int(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"rank must be a positive integer, 'dense' or 'auto', got {value!r}") from err
    if rank < 1:  # 0 is no rank (it was once read as 'dense'): say which to use rather than guess
        raise argparse.ArgumentTypeError(f"rank must be a positive integer, 'dense' (a full A) or 'auto', got {rank}")
    return rank


def _budget_cells(value: str) -> int | None:
    if value.lower() == "all":
        return None
    return positive_int(value, "budget-cells to be a positive number of cells or 'all'")


def _fill_fdr(value: str) -> float | None:
    if value.lower() == "none":
        return None
    try:
        return float(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"budget-fill-fdr must be a rate in (0, 1) or 'none', got {value!r}") from err


def _max_steps(value: str) -> int | str | None:
    if value.lower() in ("none", "auto"):
        return None if value.lower() == "none" else "auto"
    return positive_int(value, "max-steps to be a positive number of steps, 'auto' or 'none'")


def _h_every(value: str) -> int | None:
    if value.lower() == "auto":
        return None
    return positive_int(value, "h-every to be a positive integer or 'auto'")


def register(commands) -> None:
    parser = commands.add_parser("causal", help="learn the causal gene graph (Step I) into varp['cape_dag']")
    parser.add_argument("--input", "-i", required=True, help="input .h5ad (preprocessed), or 'dataset:NAME'")
    parser.add_argument("--output", "-o", required=True, help="output .h5ad")
    parser.add_argument("--model", choices=MODELS, default="variational",
                        help="Step I model: 'variational' (variational NOTEARS, any number of genes; default), "
                             "'parents_mlp' (each gene an MLP of its candidate parents; gene panels) or 'paper' "
                             "(the paper's settings: rank 40, λs 1; add --tau 0.2 for its threshold)")
    parser.add_argument("--rank", type=_rank, default="auto",
                        help="rank of A = UVᵀ, 'dense', or 'auto' (default: dense on the screened candidate parents; "
                             "without candidates dense up to 1,000 genes, else 40)")
    parser.add_argument("--tau", type=tau_value, default="budget",
                        help="edge threshold τ in [0, 1), or a rule: 'budget' (default): as many edges as gene pairs "
                             "with a significant partial correlation (BH at --budget-fdr), less those the test "
                             "calls with every gene permuted over the cells; 'auto': the paper's 0.2 "
                             "unless it leaves fewer than --min-positioned of the genes with an edge, then the "
                             "largest τ that does")
    parser.add_argument("--budget-fdr", type=float, default=CausalConfig.budget_fdr,
                        help=f"Benjamini-Hochberg rate of the budget rule's partial-correlation test "
                             f"({CausalConfig.budget_fdr:g}); a lower rate keeps fewer, better-supported edges")
    parser.add_argument("--budget-fill-fdr", type=_fill_fdr, default=CausalConfig.budget_fill_fdr,
                        help=f"where fewer pairs than genes pass --budget-fdr, the budget takes up to one pair per "
                             f"gene from those significant at this looser rate ({CausalConfig.budget_fill_fdr:g}); "
                             "'none': the --budget-fdr count alone")
    parser.add_argument("--budget-test", choices=BUDGET_TESTS, default=CausalConfig.budget_test,
                        help="how the budget rule tests a pair: 'both' (default): Fisher's z and the robust test "
                             "must agree (holds its false discovery rate); 'fisher': Fisher's z, too liberal where "
                             "cell types switch genes on and off (keeps more edges); 'robust': a sandwich test that "
                             "allows each cell its own variance, on pairs of genes detected in at least 10 cells")
    parser.add_argument("--pair-ranking", choices=PAIR_RANKINGS, default=CausalConfig.pair_ranking,
                        help="which gene pairs the budget rule keeps: 'auto' (default): 'consensus' where "
                             "--interventions names intervened cells, else 'shrunk_partial_correlation'; 'consensus': "
                             "those ranked highest by the fit's weights and their partial correlations together; "
                             "'fit': the fit's heaviest "
                             "weights alone; 'shrunk_partial_correlation': those with the largest shrunk "
                             "partial correlation, in the fit's direction")
    parser.add_argument("--budget-cells", type=_budget_cells, default=CausalConfig.budget_cells,
                        help=f"the most cells the budget rule's test counts on, at least 10 per gene, drawn at "
                             f"random with the run's seed ({CausalConfig.budget_cells}), or 'all'")
    parser.add_argument("--min-positioned", type=float, default=0.5,
                        help="fraction of genes that must get an edge (0.5): below it, tau=auto stops with the "
                             "reason and a fixed tau warns; 0 turns the check off")
    parser.add_argument("--lambda-sparse", type=float, default=None,
                        help="L1 weight λs (default: 0.3 for a dense A, 1.0 for low rank)")
    parser.add_argument("--epochs", type=int, default=100, help="training epochs (100)")
    parser.add_argument("--max-steps", type=_max_steps, default=CausalConfig.max_steps,
                        help=f"the most AdamW steps: on many cells the epochs are cut to max-steps / batches per "
                             f"epoch; 'auto' ({MAX_GENE_STEPS:,} / genes, at least 10 epochs; the default); "
                             f"'none': --epochs alone")
    parser.add_argument("--batch-size", type=int, default=128, help="cells per minibatch (128)")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (3e-3)")
    parser.add_argument("--use-genes", default="cape_used",
                        help="boolean var column selecting genes ('cape_used'; all genes when absent); 'all'")
    parser.add_argument("--layer", default=None, help="use this layer instead of X")
    parser.add_argument("--interventions", default=None, metavar="OBS_KEY",
                        help="obs column of per-cell perturbation labels in GEARS form ('ctrl', 'A+ctrl', 'A+B'): "
                             "each perturbed gene's own equation is left out for its cells, and kept edges are "
                             "turned where the genes' shifts under the interventions contradict them")
    parser.add_argument("--leave-out-targets", action=argparse.BooleanOptionalAction,
                        default=CausalConfig.leave_out_targets,
                        help="with --interventions: leave each perturbed gene's own equation out for its cells "
                             "(knock-outs, knock-downs; default); --no-leave-out-targets fits every cell as "
                             "observational and uses the labels only to orient (drugs acting on a protein's "
                             "activity, not its level)")
    parser.add_argument("--orient-by-shifts", action=argparse.BooleanOptionalAction,
                        default=CausalConfig.orient_by_shifts,
                        help="with --interventions: turn kept edges i → j where i shifted under j's intervention "
                             "and j did not under i's (t-test against the controls, BH 5 %%; default)")
    parser.add_argument("--orient-by-likelihood", action=argparse.BooleanOptionalAction,
                        default=CausalConfig.orient_by_likelihood,
                        help="without --interventions: turn kept edges round where the Gaussian likelihood of the "
                             "standardised genes rises beyond a likelihood-ratio test at 5 %% (default)")
    parser.add_argument("--edge-confidence", action=argparse.BooleanOptionalAction,
                        default=CausalConfig.edge_confidence,
                        help="test each kept edge again given the child's other parents and the cells' state "
                             "(Leiden clusters) and store its confidence, 1 − q, in varp['cape_dag_confidence'], "
                             "its partial correlation in varp['cape_dag_partial_correlation'] and its genes' partial "
                             "correlation given every other gene in varp['cape_dag_pair_partial_correlation'] "
                             "(default)")
    parser.add_argument("--drop-guesses", action=argparse.BooleanOptionalAction, default=CausalConfig.drop_guesses,
                        help="remove the edges whose confidence stays below 0.95 (with --edge-confidence; on "
                             "mixtures of cell types mostly pairs that only differ between the types)")
    parser.add_argument("--screen", choices=SCREENS, default="partial_correlation",
                        help="candidate parents of a dense A: gene pairs with a significant partial correlation "
                             "(20 %% FDR; default), or 'none'")
    parser.add_argument("--h-every", type=_h_every, default=None,
                        help="steps between exact acyclicity evaluations, linearised in between, or 'auto' "
                             "(exact while the exponential is small, else every 10 steps)")
    parser.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> CausalConfig:
    """The :class:`~cape.causal.CausalConfig` of ``cape causal``'s flags (one flag per field)."""
    return CausalConfig(model=args.model, rank=args.rank, tau=args.tau, budget_fdr=args.budget_fdr,
                        budget_fill_fdr=args.budget_fill_fdr, budget_test=args.budget_test,
                        pair_ranking=args.pair_ranking, budget_cells=args.budget_cells,
                        min_positioned=args.min_positioned, lambda_sparse=args.lambda_sparse, epochs=args.epochs,
                        max_steps=args.max_steps, batch_size=args.batch_size, lr=args.lr,
                        h_every=args.h_every, screen=args.screen, leave_out_targets=args.leave_out_targets,
                        orient_by_shifts=args.orient_by_shifts, orient_by_likelihood=args.orient_by_likelihood,
                        edge_confidence=args.edge_confidence,
                        drop_guesses=args.drop_guesses)


def run(args: argparse.Namespace) -> int:
    out = check_output(args.output, args.input)
    config = config_from_args(args)
    adata = read_input(args.input)
    if args.use_genes == "cape_used" and "cape_used" not in adata.var:
        if detect_scale(adata) == "counts":  # raw counts of every gene: Step I would run on all of them
            raise CapeInputError(f"{args.input} holds raw counts and no var['cape_used']: run `cape preprocess` "
                                 f"first (or pass --use-genes all to use all {adata.n_vars} genes as they are)")
    causal_graph(adata, config, use_genes=None if args.use_genes == "all" else args.use_genes,
                 layer=args.layer, interventions=args.interventions, device="auto", seed=None)
    write_h5ad(adata, out)
    return 0
