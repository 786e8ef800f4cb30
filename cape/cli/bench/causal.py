"""``cape bench causal``: causal discovery, cape against gcastle and DAGMA peers (synthetic data, Sachs)."""

from __future__ import annotations

import argparse

from ...bench.causal import run_causal_benchmark
from ._data import add_run_options


def register(bench) -> None:
    b = bench.add_parser("causal", help="causal discovery: cape vs gcastle and DAGMA peers (synthetic, Sachs)")
    add_run_options(b, "small settings, few seeds and peers (minutes)")
    b.add_argument("--settings", default=None,
                   help="comma-separated subset of settings (fig3,m20,m50,m100,sachs_obs,sachs_all)")
    b.add_argument("--methods", default=None, help="comma-separated subset of methods")
    b.add_argument("--seeds", type=int, default=None, help="number of seeds (5; quick: 2)")
    b.add_argument("--seed-offset", type=int, default=0,
                   help="first seed (0): e.g. choose settings on seeds 5-9, report seeds 0-4")
    b.add_argument("--standardize", choices=["no", "yes", "both"], default="no",
                   help="feed every method z-scored variables ('yes'), the raw matrix ('no', default) or run "
                        "both; records carry input=raw|standardized")
    b.add_argument("--budget", type=float, default=None, help="seconds allowed per peer run (600; quick: 60)")
    b.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def split(value: str | None) -> list[str] | None:
        return [x.strip() for x in value.split(",") if x.strip()] if value else None

    run_causal_benchmark(out=args.out, quick=args.quick, settings=split(args.settings),
                         methods=split(args.methods), n_seeds=args.seeds, budget=args.budget,
                         seed_offset=args.seed_offset,
                         inputs={"no": ["raw"], "yes": ["standardized"], "both": ["raw", "standardized"]}[
                             args.standardize])
    return 0
