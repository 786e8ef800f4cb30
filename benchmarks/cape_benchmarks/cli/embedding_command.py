"""``cape-bench embedding``: Step II fidelity (MAP, Spearman), hyperbolic vs Euclidean, and scaling."""

from __future__ import annotations

import argparse

from ..embedding import run_benchmark
from ._data import add_run_options


def register(bench) -> None:
    emb = bench.add_parser("embedding", help="Step II fidelity: MAP and Spearman, hyperbolic vs Euclidean")
    add_run_options(emb, "small run for smoke tests")
    emb.add_argument("--dims", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    emb.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    emb.add_argument("--epochs", type=int, default=1000)
    emb.add_argument("--sections", nargs="+", choices=["fidelity", "scaling", "hierarchy"],
                     default=["fidelity", "scaling"],
                     help="fidelity: MAP/Spearman vs dimension; scaling: sampled vs exact loss, 2,000-gene timing; "
                          "hierarchy: Spearman(generality, -norm) on sparse hub graphs and pbmc68k_reduced's DAG")
    emb.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_benchmark(args.out, quick=args.quick, dims=args.dims, seeds=args.seeds, epochs=args.epochs,
                  sections=args.sections)
    return 0
