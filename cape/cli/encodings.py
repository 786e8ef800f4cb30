"""``cape encodings`` (list the positional encodings), ``cape bench attention`` and ``cape bench non-relativity``."""

from __future__ import annotations

import argparse


def register(commands, bench) -> None:
    lister = commands.add_parser("encodings", help="list the positional encodings and what each needs")
    lister.set_defaults(func=_list)
    parser = bench.add_parser(
        "attention",
        help="time and peak memory of one attention layer per positional encoding vs plain SDPA",
        description="Forward+backward time and peak memory of one attention layer (batch 8, 1,200 genes, "
        "D=512, 8 heads; --quick: batch 2, 256 genes, D=128, 4 heads) for every positional encoding, "
        "against plain scaled_dot_product_attention. Writes <out>/attention.{json,md,png}.",
    )
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    parser.add_argument("--out", default="results/bench", help="output folder (default: results/bench)")
    parser.add_argument("--encodings", default=None,
                        help="comma-separated encodings to include (default: all; see 'cape encodings')")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5; quick 10)")
    parser.set_defaults(func=_bench_attention)
    nri = bench.add_parser(
        "non-relativity",
        help="Behind-RoPE non-relativity of the attention per layer, per encoding, before/after pretraining",
        description="Pretrains a small model per encoding on an AnnData with the CAPE keys (e.g. "
        "results/<dataset>/encoded.h5ad) and reports the non-relativity index of every layer against the "
        "encoding's own positions and against the Poincaré distance. Writes <out>/non_relativity.{json,md,png}.",
    )
    nri.add_argument("--input", "-i", required=True, help=".h5ad with varp['cape_dag'] and varm['cape_poincare']")
    nri.add_argument("--encodings", default=None, help="comma-separated (default: none,trainable_absolute,rope,cape)")
    nri.add_argument("--architecture", default="scgpt", choices=["scgpt", "scbert"])
    nri.add_argument("--epochs", type=int, default=None, help="pretraining epochs (default 5; quick 1)")
    nri.add_argument("--seeds", type=int, nargs="+", default=[0])
    nri.add_argument("--quick", action="store_true", help="200 cells, 1 epoch, 128 tokens per cell")
    nri.add_argument("--out", default="results/bench", help="output folder (default: results/bench)")
    nri.set_defaults(func=_bench_non_relativity)


def _list(args: argparse.Namespace) -> int:
    from .. import encodings
    from ..encodings.base import POSITION_SOURCES

    for name in encodings.available():
        cls = encodings.get_class(name)
        needs = "nothing" if cls.requires is None else POSITION_SOURCES[cls.requires].split(" missing")[0]
        if cls.requires == "co_expression":
            needs = "gene2vec file or co-expression vectors"
        provides = ", ".join(sorted(cls.provides)) or "-"
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        print(f"{name:<19} provides: {provides:<10} needs: {needs:<38} {doc}")
    return 0


def _bench_attention(args: argparse.Namespace) -> int:
    from .._errors import CapeInputError
    from .._settings import resolve_seed, settings
    from ..bench import attention

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


def _bench_non_relativity(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..bench.layer_relativity import run_benchmark
    from ._io import read_input

    adata = read_input(args.input, expect_counts=False)
    if args.quick:
        adata = adata[: min(adata.n_obs, 200)].copy()
    names = [n.strip() for n in args.encodings.split(",") if n.strip()] if args.encodings else None
    run_benchmark(adata, args.out, dataset=Path(args.input).stem, encodings=names, architecture=args.architecture,
                  epochs=args.epochs or (1 if args.quick else 5), seeds=args.seeds,
                  max_len=128 if args.quick else 256)
    print(f"wrote {Path(args.out) / 'non_relativity.md'}")
    return 0
