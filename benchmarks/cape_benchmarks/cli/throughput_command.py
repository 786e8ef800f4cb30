"""``cape-bench throughput``: Step I, Step II, pretraining and fine-tuning on the CPU and CUDA side by side."""

from __future__ import annotations

import argparse

from ..throughput import DESIGN_STAGES, run_throughput
from ._data import add_run_options

STAGES = ("step1", "step2", "pretrain", "finetune", "scgpt")
DESIGNS = tuple(d for d in DESIGN_STAGES if d != "quick")


def register(bench) -> None:
    sub = bench.add_parser("throughput", help="seconds and cells/s of every stage, CPU and CUDA side by side "
                                              "(2,000 simulated genes, 10,000 cells)")
    add_run_options(sub, "the quick design (200 genes, 2,000 cells)")
    sub.add_argument("--devices", nargs="+", default=None,
                     help="devices to time, e.g. cpu cuda (default: cpu, and cuda when available)")
    sub.add_argument("--design", choices=DESIGNS, default="scale",
                     help="scale: 2,000 genes x 10,000 cells (default); transcriptome: 10,000 genes x 50,000 cells, "
                          "Step I and Step II, CUDA unless --devices names the CPU")
    sub.add_argument("--stages", nargs="+", choices=STAGES, default=None,
                     help=f"default: all ({' '.join(STAGES)}); with --design transcriptome step1 step2")
    sub.add_argument("--pretrain-cells", type=int, default=4000, help="cells per pretraining epoch (4000)")
    sub.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_throughput(args.out, devices=args.devices, quick=args.quick, stages=args.stages,
                   seed=args.seed if args.seed is not None else 0, pretrain_cells=args.pretrain_cells,
                   design=args.design)
    return 0
