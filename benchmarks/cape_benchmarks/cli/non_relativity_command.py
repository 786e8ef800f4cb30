"""``cape-bench non-relativity``: Behind-RoPE non-relativity of the attention per layer and encoding,
before and after pretraining."""

from __future__ import annotations

import argparse
from pathlib import Path

from cape.cli._command_io import read_input

from ..layer_relativity import run_benchmark
from ._data import add_run_options


def register(bench) -> None:
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
    add_run_options(nri, "200 cells, 1 epoch, 128 tokens per cell")
    nri.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    adata = read_input(args.input, expect_counts=False)
    if args.quick:
        adata = adata[: min(adata.n_obs, 200)].copy()
    names = [n.strip() for n in args.encodings.split(",") if n.strip()] if args.encodings else None
    run_benchmark(adata, args.out, dataset=Path(args.input).stem, encodings=names, architecture=args.architecture,
                  epochs=args.epochs or (1 if args.quick else 5), seeds=args.seeds,
                  max_len=128 if args.quick else 256)
    print(f"wrote {Path(args.out) / 'non_relativity.md'}")
    return 0
