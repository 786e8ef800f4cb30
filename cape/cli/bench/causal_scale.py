"""``cape bench causal-scale``: time per epoch of Step I against cells N and genes M."""

from __future__ import annotations

import argparse

from ...bench.causal_scale import run_causal_scale


def register(bench) -> None:
    s = bench.add_parser("causal-scale", help="time per epoch of Step I against cells N and genes M")
    s.add_argument("--quick", action="store_true", help="fewer, smaller sizes")
    s.add_argument("--out", default="results/bench", help="output folder (results/bench)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_causal_scale(out=args.out, quick=args.quick)
    return 0
