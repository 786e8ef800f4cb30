"""``cape data list``, ``cape data fetch NAME`` and ``cape data simulate`` (a matrix shaped like a real run)."""

from __future__ import annotations

import argparse
import textwrap

from .. import data
from .._io import write_h5ad
from ..data import manifests, simulate_expression
from ._command_io import check_output


def register(commands) -> None:
    parser = commands.add_parser("data", help="list and fetch the named datasets of data_manifests/")
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", parser_class=type(parser))
    sub.required = True
    lister = sub.add_parser("list", help="list the named datasets")
    lister.set_defaults(func=_list)
    fetcher = sub.add_parser("fetch", help="download (or locate) and verify a dataset; optionally write it as h5ad")
    fetcher.add_argument("name", help="dataset name (see 'cape data list')")
    fetcher.add_argument("--output", "-o", default=None, help="also write the loaded AnnData to this .h5ad")
    fetcher.set_defaults(func=_fetch)
    sim = sub.add_parser("simulate", help="write a synthetic matrix shaped like a real run (10x UMI or TPM)")
    sim.add_argument("--output", "-o", required=True, help="output .h5ad")
    sim.add_argument("--kind", choices=["umi", "tpm"], default="umi",
                     help="'umi': sparse 10x-like raw counts; 'tpm': SMART-seq-like TPM (umi)")
    sim.add_argument("--cells", type=int, default=5000, help="number of cells (5000)")
    sim.add_argument("--genes", type=int, default=33000, help="number of genes (33000)")
    sim.add_argument("--cell-types", type=int, default=5, help="cell types in obs['cell_type'] (5)")
    sim.add_argument("--regulated", type=int, default=200,
                     help="genes on the known regulatory DAG in varp['true_dag'] (200)")
    sim.add_argument("--seed", type=int, default=0)
    sim.set_defaults(func=_simulate)


def _list(args: argparse.Namespace) -> int:
    for name, m in manifests().items():
        summary = textwrap.shorten(m.description, width=90, placeholder=" …")
        print(f"{name:<18} {m.source['type']:<10} {summary}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    if args.output is not None:
        check_output(args.output)
    files = data.fetch(args.name)
    for role, path in files.items():
        print(f"{args.name} {role}: {path}")
    if args.output is not None:
        write_h5ad(data.load(args.name), args.output)
        print(f"{args.name} written to {args.output}")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    out = check_output(args.output)
    adata = simulate_expression(args.cells, args.genes, kind=args.kind, n_cell_types=args.cell_types,
                                n_regulated=args.regulated, seed=args.seed)
    write_h5ad(adata, out)
    print(f"{args.kind} matrix, {adata.n_obs} cells × {adata.n_vars} genes, written to {out}")
    return 0
