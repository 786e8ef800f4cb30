"""``cape-bench causal``: causal discovery, cape against gcastle and DAGMA peers (synthetic data, Sachs)."""

from __future__ import annotations

import argparse

from ..causal import DIAGNOSE, SETTINGS, parse_tau, run_causal_benchmark
from ..count_panel import MEMBERS, PANEL_METHODS, run_count_panel
from ._data import add_run_options


def register(bench) -> None:
    b = bench.add_parser("causal", help="causal discovery: cape vs gcastle and DAGMA peers (synthetic, Sachs)")
    add_run_options(b, "small settings, few seeds and peers (minutes)")
    b.add_argument("--settings", default=None,
                   help=f"comma-separated subset of settings ({','.join(SETTINGS)})")
    b.add_argument("--methods", default=None, help="comma-separated subset of methods")
    b.add_argument("--seeds", type=int, default=None, help="number of seeds (5; quick: 2)")
    b.add_argument("--seed-offset", type=int, default=0,
                   help="first seed (0): e.g. choose settings on seeds 5-9, report seeds 0-4")
    b.add_argument("--standardize", choices=["no", "yes", "both"], default="no",
                   help="feed every method z-scored variables ('yes'), the raw matrix ('no', default) or run "
                        "both; records carry input=raw|standardized")
    b.add_argument("--budget", type=float, default=None, help="seconds allowed per peer run (600; quick: 60)")
    b.add_argument("--taus", default=None,
                   help="comma-separated extra thresholds τ each cape fit is also scored at (rows method@τ); "
                        "'budget' is cape.tl.causal_graph's default rule, 'budget<fdr>' the same at another false "
                        "discovery rate (e.g. budget0.2; the undirected peers get rows at each budget too, except "
                        "with --panel counts), 'auto' the positioning rule; a prefix names the budget's pair "
                        "ranking: 'fit-budget' (the fit's weights alone), 'consensus-budget', 'shrunk-budget' "
                        "(the shrunk partial correlations); a suffix the budget's test: 'budget:robust', "
                        "'budget0.2:fisher'")
    b.add_argument("--diagnose", action="store_true",
                   help=f"one experiment per suspected cause of cape's losses: methods {','.join(DIAGNOSE['methods'])} "
                        f"(unless --methods), thresholds {','.join(map(str, DIAGNOSE['taus']))} (unless --taus)")
    b.add_argument("--panel", choices=["counts"], default=None,
                   help="run a settings group instead: 'counts' = Step I's defaults against partial correlation, "
                        f"graphical lasso, GRNBoost2 and DAGMA-linear on count simulators ({', '.join(MEMBERS)}); "
                        "--settings then names panel settings (default each member's base; 'all': every sweep), "
                        f"--methods a subset of {','.join(PANEL_METHODS)}")
    b.add_argument("--cells", type=int, default=None, help="--panel: cells per simulation (3000; quick: 300)")
    b.add_argument("--genes", type=int, default=None,
                   help="--panel: genes per simulation, 1.5 edges per gene (120; quick: 20; bn_counts: arth150)")
    b.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def split(value: str | None) -> list[str] | None:
        return [x.strip() for x in value.split(",") if x.strip()] if value else None

    methods, taus = split(args.methods), split(args.taus)
    if args.panel == "counts":
        run_count_panel(out=args.out, quick=args.quick, settings=split(args.settings), methods=methods,
                        n_seeds=args.seeds, seed_offset=args.seed_offset, budget=args.budget, n_cells=args.cells,
                        n_genes=args.genes, taus=[parse_tau(t) for t in taus or []])
        return 0
    if args.diagnose:
        methods = methods or list(DIAGNOSE["methods"])
        taus = taus or list(DIAGNOSE["taus"])
    taus = [parse_tau(t) for t in taus or []]
    run_causal_benchmark(out=args.out, quick=args.quick, settings=split(args.settings),
                         methods=methods, n_seeds=args.seeds, budget=args.budget,
                         seed_offset=args.seed_offset, taus=taus,
                         inputs={"no": ["raw"], "yes": ["standardized"], "both": ["raw", "standardized"]}[
                             args.standardize])
    return 0
