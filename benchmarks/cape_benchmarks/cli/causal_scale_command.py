"""``cape-bench causal-scale``: time per epoch of Step I against cells N and genes M."""

from __future__ import annotations

import argparse

from ..causal_scale import run_causal_scale
from ._data import add_run_options


def register(bench) -> None:
    s = bench.add_parser("causal-scale", help="time per epoch of Step I against cells N and genes M")
    add_run_options(s, "fewer, smaller sizes")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_causal_scale(out=args.out, quick=args.quick)
    return 0
