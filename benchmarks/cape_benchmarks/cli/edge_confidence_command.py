"""``cape-bench edge-confidence``: how well Step I's edge confidence ranks its kept edges on cell-type mixtures."""

from __future__ import annotations

import argparse

from ..edge_confidence import TYPES, run_edge_confidence
from ._data import add_run_options


def register(bench) -> None:
    sub = bench.add_parser("edge-confidence", help="Step I's edge confidence against its |weight| on NB counts from "
                                                   "1, 3 and 8 cell types (AUPRC among the kept edges)")
    add_run_options(sub, "a small design (24 genes, 400 cells, 10 epochs), one seed")
    sub.add_argument("--seeds", type=int, default=None, help="number of seeds (5; quick: 1)")
    sub.add_argument("--seed-offset", type=int, default=0, help="first seed (0)")
    sub.add_argument("--types", type=int, nargs="+", default=list(TYPES), help="cell-type counts (1 3 8)")
    sub.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_edge_confidence(args.out, quick=args.quick, seeds=args.seeds, seed_offset=args.seed_offset,
                        types=tuple(args.types))
    return 0
