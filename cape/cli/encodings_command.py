"""``cape encodings``: the positional encodings and what each needs."""

from __future__ import annotations

import argparse

from .. import encodings
from ..encodings.base import POSITION_SOURCES


def register(commands) -> None:
    lister = commands.add_parser("encodings", help="list the positional encodings and what each needs")
    lister.set_defaults(func=_list)


def _list(args: argparse.Namespace) -> int:
    for name in encodings.available():
        cls = encodings.get_class(name)
        needs = "nothing" if cls.requires is None else POSITION_SOURCES[cls.requires].split(" missing")[0]
        if cls.requires == "co_expression":
            needs = "gene2vec file or co-expression vectors"
        provides = ", ".join(sorted(cls.provides)) or "-"
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        print(f"{name:<19} provides: {provides:<10} needs: {needs:<38} {doc}")
    return 0
