"""``cape preprocess``: QC, normalisation, log1p and HVG selection of an input file (or a named dataset)."""

from __future__ import annotations

import argparse

from .._io import write_h5ad
from ..pp import preprocess
from ..pp._recipe import HVG_FLAVORS, N_TOP_GENES
from ..tasks.perturbation_workflow import gears_labels
from ._command_io import check_output, read_input


def register(commands) -> None:
    parser = commands.add_parser("preprocess", help="QC, normalise, log1p and select genes (paper Supp. F.1.1)")
    parser.add_argument("--input", "-i", required=True,
                        help="input .h5ad/.h5/.loom/.csv/.zarr, or 'dataset:NAME' for a named dataset")
    parser.add_argument("--output", "-o", required=True, help="output .h5ad")
    parser.add_argument("--transpose", action="store_true",
                        help="the input is genes × cells (rows are genes): read it the other way round")
    parser.add_argument("--min-genes", type=int, default=200, help="min detected genes per cell (200)")
    parser.add_argument("--min-cells", type=int, default=0, help="min cells per gene (0 = keep all genes)")
    parser.add_argument("--target-sum", type=float, default=1e4, help="library size after normalisation (1e4)")
    parser.add_argument("--no-log1p", dest="log1p", action="store_false", help="skip log1p after normalisation")
    parser.add_argument("--n-top-genes", type=int, default=N_TOP_GENES,
                        help=f"highly variable genes to use ({N_TOP_GENES}; the paper used 2000)")
    parser.add_argument("--hvg-flavor", default="seurat", choices=HVG_FLAVORS,
                        help="how to rank genes: seurat (default), cell_ranger; on raw counts seurat_v3 "
                             "(needs scikit-misc) or pearson_residuals")
    parser.add_argument("--interventions", default=None, metavar="OBS_KEY",
                        help="obs column of per-cell perturbation labels (ctrl, A+ctrl, A+B; other spellings such as "
                             "non-targeting or A_B are rewritten so): use every perturbed gene that varies besides "
                             "the HVGs, so that `cape causal --interventions` and `cape perturb` can use them")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = check_output(args.output, args.input)
    adata = read_input(args.input, transpose=args.transpose)
    if args.interventions is not None and args.interventions in adata.obs:
        adata.obs[args.interventions] = gears_labels(adata, args.interventions).to_numpy()
    preprocess(adata, min_genes=args.min_genes, target_sum=args.target_sum, log1p=args.log1p,
               n_top_genes=args.n_top_genes, min_cells=args.min_cells, hvg_flavor=args.hvg_flavor,
               interventions=args.interventions)
    write_h5ad(adata, out)
    return 0
