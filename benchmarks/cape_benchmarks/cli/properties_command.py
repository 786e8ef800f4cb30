"""``cape-bench properties``: the paper's Sec. 4 (Fig. 3c, Props 4.1/4.2 with Fig. S2, Prop. 4.3 with Fig. S3)."""

from __future__ import annotations

import argparse

from ..properties import run_benchmark
from ._data import add_run_options


def register(bench) -> None:
    props = bench.add_parser("properties", help="paper Sec. 4: Fig. 3c, Props 4.1/4.2 (Fig. S2), 4.3 (Fig. S3)")
    add_run_options(props, "small run for smoke tests")
    props.add_argument("--step1-epochs", type=int, default=None,
                       help="Step I epochs for Fig. 3c (default 100, the paper's; 20 with --quick)")
    props.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_benchmark(args.out, quick=args.quick, step1_epochs=args.step1_epochs)
    return 0
