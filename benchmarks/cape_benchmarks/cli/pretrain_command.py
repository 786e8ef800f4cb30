"""``cape-bench pretrain``: pretraining cells/s and loss per backbone × encoding."""

from __future__ import annotations

import argparse

from ..pretrain import run_benchmark
from ._data import add_run_options


def register(bench) -> None:
    pre = bench.add_parser("pretrain", help="pretraining cells/s and loss per backbone × encoding (pbmc68k_reduced)")
    add_run_options(pre, "200 cells, 2 epochs, encodings none and cape")
    pre.add_argument("--input", default=None, help=".h5ad to use instead of pbmc68k_reduced (CAPE keys used)")
    pre.add_argument("--architectures", nargs="+", choices=["scgpt", "scbert"], default=None)
    pre.add_argument("--encodings", nargs="+", default=None, help="default: none trainable_absolute rope cape")
    pre.add_argument("--epochs", type=int, default=None, help="default 10 (2 with --quick)")
    pre.add_argument("--seeds", type=int, nargs="+", default=None)
    pre.add_argument("--threads", type=int, default=2, help="torch CPU threads (2)")
    pre.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_benchmark(args.out, quick=args.quick, input_path=args.input, architectures=args.architectures,
                  encoding_names=args.encodings, epochs=args.epochs, seeds=args.seeds, threads=args.threads)
    return 0
