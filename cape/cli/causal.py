"""``cape causal`` (Step I on a file) and the benchmarks ``cape bench causal`` / ``cape bench causal-scale``."""

from __future__ import annotations

import argparse

from ._io import positive_int


def _rank(value: str) -> int | None:
    if value.lower() in {"dense", "none", "0"}:
        return None
    try:
        return int(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"rank must be an integer or 'dense', got {value!r}") from err


def _tau(value: str) -> float | str:
    # A number out of range is left to cape.tl.causal_graph, which refuses it in one line (exit 2).
    if value.strip().lower() == "auto":
        return "auto"
    try:
        return float(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"tau must be a number in [0, 1) or 'auto', got {value!r}") from err


def _h_every(value: str) -> int | None:
    if value.lower() == "auto":
        return None
    return positive_int(value, "h-every to be a positive integer or 'auto'")


def register(commands, bench) -> None:
    parser = commands.add_parser("causal", help="learn the causal gene graph (Step I) into varp['cape_dag']")
    parser.add_argument("--input", "-i", required=True, help="input .h5ad (preprocessed), or 'dataset:NAME'")
    parser.add_argument("--output", "-o", required=True, help="output .h5ad")
    parser.add_argument("--rank", type=_rank, default=40, help="rank of A = UVᵀ, or 'dense' (40)")
    parser.add_argument("--tau", type=_tau, default="auto",
                        help="edge threshold τ in [0, 1), or 'auto' (default): the paper's 0.2 unless it leaves "
                             "fewer than --min-positioned of the genes with an edge, then the largest τ that does")
    parser.add_argument("--min-positioned", type=float, default=0.5,
                        help="fraction of genes that must get an edge (0.5): below it, tau=auto stops with the "
                             "reason and a fixed tau warns; 0 turns the check off")
    parser.add_argument("--lambda-sparse", type=float, default=1.0, help="L1 weight λs (1.0)")
    parser.add_argument("--epochs", type=int, default=100, help="training epochs (100)")
    parser.add_argument("--batch-size", type=int, default=128, help="cells per minibatch (128)")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (3e-3)")
    parser.add_argument("--use-genes", default="cape_used",
                        help="boolean var column selecting genes ('cape_used'; all genes when absent); 'all'")
    parser.add_argument("--layer", default=None, help="use this layer instead of X")
    parser.add_argument("--h-every", type=_h_every, default=None,
                        help="steps between exact acyclicity evaluations, linearised in between, or 'auto' "
                             "(exact while the exponential is small, else every 10 steps)")
    parser.set_defaults(func=run)

    b = bench.add_parser("causal", help="causal discovery: cape vs gcastle and DAGMA peers (synthetic, Sachs)")
    b.add_argument("--quick", action="store_true", help="small settings, few seeds and peers (minutes)")
    b.add_argument("--out", default="results/bench", help="output folder (results/bench)")
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
    b.set_defaults(func=run_bench)

    s = bench.add_parser("causal-scale", help="time per epoch of Step I against cells N and genes M")
    s.add_argument("--quick", action="store_true", help="fewer, smaller sizes")
    s.add_argument("--out", default="results/bench", help="output folder (results/bench)")
    s.set_defaults(func=run_scale)


def run(args: argparse.Namespace) -> int:
    from .._io import write_h5ad
    from ..tl.causal_graph import causal_graph
    from ._io import check_output, read_input

    out = check_output(args.output, args.input)
    adata = read_input(args.input)
    if args.use_genes == "cape_used" and "cape_used" not in adata.var:
        from .._errors import CapeInputError
        from ..pp.preprocess import detect_scale

        if detect_scale(adata) == "counts":  # raw counts of every gene: Step I would run on all of them
            raise CapeInputError(f"{args.input} holds raw counts and no var['cape_used']: run `cape preprocess` "
                                 f"first (or pass --use-genes all to use all {adata.n_vars} genes as they are)")
    causal_graph(adata, rank=args.rank, tau=args.tau, lambda_sparse=args.lambda_sparse, epochs=args.epochs,
                 batch_size=args.batch_size, lr=args.lr, device="auto", seed=None,
                 use_genes=None if args.use_genes == "all" else args.use_genes, layer=args.layer,
                 h_every=args.h_every, min_positioned=args.min_positioned)
    write_h5ad(adata, out)
    return 0


def run_bench(args: argparse.Namespace) -> int:
    from ..bench.causal import run_causal_benchmark

    def split(value: str | None) -> list[str] | None:
        return [x.strip() for x in value.split(",") if x.strip()] if value else None

    run_causal_benchmark(out=args.out, quick=args.quick, settings=split(args.settings),
                         methods=split(args.methods), n_seeds=args.seeds, budget=args.budget,
                         seed_offset=args.seed_offset,
                         inputs={"no": ["raw"], "yes": ["standardized"], "both": ["raw", "standardized"]}[
                             args.standardize])
    return 0


def run_scale(args: argparse.Namespace) -> int:
    from ..bench.causal_scale import run_causal_scale

    run_causal_scale(out=args.out, quick=args.quick)
    return 0
