"""``cape-bench intervention``: predictions of the Sachs 2005 interventions from the observational cells."""

from __future__ import annotations

import argparse

from cape import data

from ..intervention import CAPE_VARIANTS, run_intervention_benchmark
from ..peers import PEERS
from ._data import add_run_options


def register(bench) -> None:
    b = bench.add_parser("intervention", help="Sachs 2005: predict real interventions from observational cells "
                                              "(Step I's equations vs no change, consensus and peer graphs)")
    add_run_options(b, "one seed, 30 epochs, the notears peer only (under a minute)")
    b.add_argument("--seeds", type=int, default=None, help="Step I seeds 0..N-1 (3; quick: 1)")
    b.add_argument("--peers", default=None,
                   help=f"comma-separated peers refit by least squares (default all: {','.join(PEERS)}); 'none'")
    b.add_argument("--variants", default=None,
                   help=f"comma-separated Step I variants (default all: {','.join(CAPE_VARIANTS)})")
    b.add_argument("--budget", type=float, default=None, help="seconds allowed per peer run (600; quick: 60)")
    b.add_argument("--input", default=None, help="Sachs data as an .h5ad (default: the registered sachs2005)")
    b.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def split(value: str | None) -> list[str] | None:
        if value is None:
            return None
        return [] if value.strip().lower() == "none" else [x.strip() for x in value.split(",") if x.strip()]

    adata = None
    if args.input is not None:
        adata = data.read(args.input, expect_counts=False)
    run_intervention_benchmark(args.out, quick=args.quick, seeds=args.seeds, peers=split(args.peers),
                               budget=args.budget, variants=split(args.variants), adata=adata)
    return 0
