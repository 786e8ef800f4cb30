"""``cape encode``: Step III on a file, rotary angles φ = c·e from the Poincaré embedding."""

from __future__ import annotations

import argparse
import math

from .._io import write_h5ad
from ..encodings.cape import DEFAULT_BAND_TOP
from ..tl._rotary_encoding import rotary_encoding
from ._command_io import check_output, read_input


def register(commands) -> None:
    encode = commands.add_parser("encode", help="Step III: rotary angles φ = c·e from the Poincaré embedding")
    encode.add_argument("--input", "-i", required=True, help="input .h5ad with varm['cape_poincare'] (`cape embed`)")
    encode.add_argument("--output", "-o", required=True, help="output .h5ad")
    encode.add_argument("--scale", type=float, default=math.pi / 4, help="angle scale c (π/4)")
    encode.add_argument("--bands", type=int, default=1,
                        help="rotation planes per Poincaré coordinate, at multipliers 1 … --band-top (1: the "
                             "paper's φ = c·e; a model then needs d·bands planes)")
    encode.add_argument("--band-top", type=float, default=DEFAULT_BAND_TOP,
                        help=f"multiplier of the highest band ({DEFAULT_BAND_TOP:g})")
    encode.set_defaults(func=run_encode)


def run_encode(args: argparse.Namespace) -> int:
    out = check_output(args.output, args.input)
    adata = read_input(args.input, expect_counts=False)
    rotary_encoding(adata, scale=args.scale, bands=args.bands, band_top=args.band_top)
    write_h5ad(adata, out)
    return 0
