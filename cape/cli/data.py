"""``cape data list`` and ``cape data fetch NAME``."""

from __future__ import annotations

import argparse
import textwrap


def register(commands, bench) -> None:
    parser = commands.add_parser("data", help="list and fetch the named datasets of data_manifests/")
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", parser_class=type(parser))
    sub.required = True
    lister = sub.add_parser("list", help="list the named datasets")
    lister.set_defaults(func=_list)
    fetcher = sub.add_parser("fetch", help="download (or locate) and verify a dataset; optionally write it as h5ad")
    fetcher.add_argument("name", help="dataset name (see 'cape data list')")
    fetcher.add_argument("--output", "-o", default=None, help="also write the loaded AnnData to this .h5ad")
    fetcher.set_defaults(func=_fetch)


def _list(args: argparse.Namespace) -> int:
    from ..data import manifests

    for name, m in manifests().items():
        summary = textwrap.shorten(m.description, width=90, placeholder=" …")
        print(f"{name:<18} {m.source['type']:<10} {summary}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from .. import data
    from .._io import write_h5ad
    from ._io import check_output

    if args.output is not None:
        check_output(args.output)
    files = data.fetch(args.name)
    for role, path in files.items():
        print(f"{args.name} {role}: {path}")
    if args.output is not None:
        write_h5ad(data.load(args.name), args.output)
        print(f"{args.name} written to {args.output}")
    return 0
