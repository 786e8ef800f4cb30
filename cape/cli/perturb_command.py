"""``cape perturb``: predict held-out perturbations of a Perturb-seq file with every predictor, score them and
write the report (the workflow's perturbation mode)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import matplotlib

from .._errors import CapeInputError
from .._settings import resolve_device, resolve_seed
from ..report.perturbation_report import write_perturbation_outputs
from ..report.statistics import N_BOOTSTRAP
from ..tasks.perturbation_workflow import (
    TARGET_VALUES,
    PerturbationSettings,
    perturbation_data,
    run_perturbation_workflow,
)
from ._command_io import check_output, positive_int, read_input

logger = logging.getLogger("cape")

#: The files ``--out-dir`` receives.
OUTPUTS = ("metrics.json", "per_perturbation.tsv", "split.tsv", "report.md", "shifts.png")


def _rank(value: str) -> int | str | None:
    """``--rank``: ``auto``, ``dense`` or a positive integer."""
    if value in ("auto", "dense"):
        return None if value == "dense" else value
    return positive_int(value, "auto, dense or a positive integer")


def _auto_bool(value: str) -> bool | str:
    """``--gears``: ``auto``, ``true`` or ``false`` (also on/off, yes/no)."""
    text = value.strip().lower()
    if text == "auto":
        return "auto"
    if text in ("true", "on", "yes", "1"):
        return True
    if text in ("false", "off", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected auto, true or false, got {value!r}")


def _cells(value: str) -> int | None:
    """``--causal-cells``: a positive integer, or ``all``."""
    return None if value == "all" else positive_int(value, "a positive integer or 'all'")


def register(commands) -> None:
    defaults = PerturbationSettings()
    parser = commands.add_parser("perturb", help="predict held-out perturbations of a Perturb-seq file with every "
                                                 "predictor and score them")
    parser.add_argument("--input", "-i", required=True,
                        help="preprocessed .h5ad (from `cape preprocess --interventions KEY`) with per-cell labels")
    parser.add_argument("--perturbations", default="condition", metavar="OBS_KEY",
                        help="obs column of perturbation labels: 'ctrl', 'A+ctrl', 'A+B' (other spellings such as "
                             "'non-targeting' or 'A_B' are converted) (condition)")
    parser.add_argument("--out-dir", required=True, help=f"output folder: {', '.join(OUTPUTS)}")
    parser.add_argument("--name", default=None, help="run name in the report and the records (input file stem)")
    parser.add_argument("--split-seed", type=int, default=defaults.split_seed, help="simulation split seed (1)")
    parser.add_argument("--n-de", type=positive_int, default=defaults.n_de, help="top DE genes scored (20)")
    parser.add_argument("--causal-epochs", type=positive_int, default=defaults.causal_epochs,
                        help=f"Step I epochs of the structural-equation predictors ({defaults.causal_epochs})")
    parser.add_argument("--causal-cells", type=_cells, default=defaults.causal_cells,
                        help="the most cells Step I reads, drawn at random with the seed; all: every cell "
                             f"({defaults.causal_cells})")
    parser.add_argument("--rank", type=_rank, default=defaults.rank,
                        help="Step I's rank: auto (dense on screened candidates, as cape causal), dense or an integer")
    parser.add_argument("--target-value", choices=TARGET_VALUES, default=defaults.target_value,
                        help="what the structural-equation predictors set a perturbed gene to: zero (knock-out, "
                             "do(x = 0)) or training (its level in the training perturbations' cells; an unseen "
                             "target moved by their median shift: knock-downs, CRISPRa) (zero)")
    parser.add_argument("--cell-eval", action=argparse.BooleanOptionalAction, default=defaults.cell_eval,
                        help="also score with cell-eval, the Virtual Cell Challenge's evaluator, where it is installed "
                             '(pip install "cape-sc[perturb]"; on)')
    parser.add_argument("--transformer", action=argparse.BooleanOptionalAction, default=defaults.transformer,
                        help="also the transformer embedding predictor, the costliest (on)")
    parser.add_argument("--pretrain-epochs", type=int, default=defaults.pretrain_epochs,
                        help="transformer pretraining epochs on the control cells (5)")
    parser.add_argument("--d-model", type=positive_int, default=defaults.d_model, help="transformer width (32)")
    parser.add_argument("--n-layers", type=positive_int, default=defaults.n_layers, help="transformer layers (1)")
    parser.add_argument("--n-heads", type=positive_int, default=defaults.n_heads, help="attention heads (2)")
    parser.add_argument("--embed-dim", type=positive_int, default=defaults.embed_dim,
                        help="dimension of the CAPE positions (Step II; ≤ d_model / 2) (8)")
    parser.add_argument("--embed-epochs", type=positive_int, default=defaults.embed_epochs,
                        help="Step II epochs for the positions (200)")
    parser.add_argument("--predictor-epochs", type=positive_int, default=defaults.predictor_epochs,
                        help="epochs of the embedding predictor on the training perturbations (400)")
    parser.add_argument("--gears", type=_auto_bool, nargs="?", const=True, default=defaults.gears,
                        help="also GEARS (Roohani et al. 2023): auto = where its extra is installed (pip install "
                             "'cape-sc[gears]'), true = required, false = off (auto)")
    parser.add_argument("--gears-epochs", type=positive_int, default=defaults.gears_epochs,
                        help=f"GEARS' training epochs ({defaults.gears_epochs}; GEARS' own default is 20)")
    parser.add_argument("--gears-cells", type=_cells, default=defaults.gears_cells,
                        help="the most cells GEARS reads, each condition keeping its share, drawn with the seed; "
                             f"all: every cell ({defaults.gears_cells})")
    parser.add_argument("--gears-go-graph", default=defaults.gears_go_graph, metavar="PATH",
                        help="GEARS' gene2go_all.pkl or a source,target,importance .csv; without it the "
                             "interventional Step I graph stands in for Gene Ontology (no download)")
    parser.add_argument("--n-boot", type=positive_int, default=N_BOOTSTRAP,
                        help=f"bootstrap resamples of the held-out perturbations ({N_BOOTSTRAP})")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out_dir = Path(args.out_dir)
    for name in OUTPUTS:
        check_output(str(out_dir / name), args.input, suffix=None, option="--out-dir")
    if 2 * args.embed_dim > args.d_model:
        raise CapeInputError(f"--embed-dim {args.embed_dim} needs --d-model ≥ {2 * args.embed_dim}")
    adata = read_input(args.input, expect_counts=False)
    data = perturbation_data(adata, args.perturbations)
    seed = resolve_seed(None)
    device = str(resolve_device("auto"))  # --device, else CUDA when available
    options = PerturbationSettings(
        split_seed=args.split_seed, n_de=args.n_de, causal_epochs=args.causal_epochs,
        causal_cells=args.causal_cells, rank=args.rank, target_value=args.target_value,
        transformer=args.transformer, pretrain_epochs=args.pretrain_epochs, d_model=args.d_model,
        n_layers=args.n_layers, n_heads=args.n_heads, embed_dim=args.embed_dim, embed_epochs=args.embed_epochs,
        predictor_epochs=args.predictor_epochs, seed=seed, device=device, cell_eval=args.cell_eval,
        gears=args.gears, gears_epochs=args.gears_epochs, gears_cells=args.gears_cells,
        gears_go_graph=args.gears_go_graph)
    result = run_perturbation_workflow(data, options)
    matplotlib.use("agg")
    name = args.name or Path(args.input).stem
    paths = write_perturbation_outputs(result, out_dir, name=name, seed=seed, n_boot=args.n_boot)
    logger.info("wrote %s", ", ".join(map(str, paths)))
    return 0
