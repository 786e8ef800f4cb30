"""``cape-bench perturbation-dag``: the perturbation workflow's predictors on data with a known gene DAG."""

from __future__ import annotations

import argparse

from cape._settings import settings as cape_settings

from ..perturbation_dag import MEMBERS, run_perturbation_dag
from ._data import add_run_options


def register(bench) -> None:
    sub = bench.add_parser("perturbation-dag", help="the perturbation workflow's predictors on simulated knock-outs "
                                                    "and knock-downs with a known DAG (simulate_grn_cells at 50 and "
                                                    "200 genes, bnlearn ecoli70, SERGIO), paired over seeds")
    add_run_options(sub, "tiny designs, one seed, 3 Step I epochs")
    sub.add_argument("--members", nargs="+", default=None, choices=list(MEMBERS),
                     help=f"which members ({' '.join(MEMBERS)}; default all)")
    sub.add_argument("--seeds", type=int, default=None, help="number of seeds (5; quick: 1)")
    sub.add_argument("--seed-offset", type=int, default=0, help="first seed (0)")
    sub.add_argument("--transformer", action="store_true", help="add the transformer predictor (slow on CPU)")
    sub.add_argument("--no-cell-eval", dest="cell_eval", action="store_false",
                     help="leave cell-eval's scores out (they are added where cell-eval is installed)")
    sub.add_argument("--causal-epochs", type=int, default=30, help="Step I's epochs (30)")
    sub.add_argument("--causal-cells", type=int, default=2000, help="most cells Step I reads (2000)")
    sub.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_perturbation_dag(args.out, quick=args.quick, members=args.members, seeds=args.seeds,
                         seed_offset=args.seed_offset, transformer=args.transformer, cell_eval=args.cell_eval,
                         causal_epochs=args.causal_epochs, causal_cells=args.causal_cells,
                         device=cape_settings.device or "auto")
    return 0
