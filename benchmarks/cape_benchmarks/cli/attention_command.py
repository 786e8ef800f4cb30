"""``cape-bench attention``: time and peak memory of one attention layer per encoding against plain SDPA."""

from __future__ import annotations

import argparse

from cape._errors import CapeInputError
from cape._settings import resolve_seed, settings

from .. import attention
from ._data import add_run_options


def register(bench) -> None:
    parser = bench.add_parser(
        "attention",
        help="time and peak memory of one attention layer per positional encoding vs plain SDPA",
        description="Forward+backward time and peak memory of one attention layer (batch 8, 1,200 genes, "
        "D=512, 8 heads; --quick: batch 2, 256 genes, D=128, 4 heads) for every positional encoding, "
        "against plain scaled_dot_product_attention. Writes <out>/attention.{json,md,png}.",
    )
    add_run_options(parser, "small shapes (a smoke run)")
    parser.add_argument("--encodings", default=None,
                        help="comma-separated encodings to include (default: all; see 'cape encodings')")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5; quick 10)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = None
    if args.encodings:
        names = [n.strip() for n in args.encodings.split(",") if n.strip()]
    if args.repeats is not None and args.repeats < 1:
        raise CapeInputError(f"--repeats must be ≥ 1, got {args.repeats}")
    records = attention.run(names, quick=args.quick, repeats=args.repeats, device=settings.device,
                            seed=resolve_seed(None))
    paths = attention.write_report(records, args.out)
    best = {r["encoding"]: r["value"] for r in records if r["metric"] == "ratio_best_vs_sdpa"}
    for name, ratio in attention.summarise(records).items():
        print(f"{name:<19} {ratio:6.3f}× plain SDPA (median), {best[name]:6.3f}× (best of repeats)")
    print(f"wrote {paths['json']}, {paths['md']}, {paths['png']}")
    return 0
