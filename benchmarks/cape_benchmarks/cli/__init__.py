"""The ``cape-bench`` command line (also ``python -m cape_benchmarks``): ``cape-bench <name>`` per benchmark.

One module per benchmark command (``<name>_command``), each with ``register(bench)`` adding its parser (with
``set_defaults(func=run)``) to the ``cape-bench`` group. The global options (``--seed``, ``--device``, ``--quiet``,
``--threads``) and the one-line errors are ``cape``'s own (:func:`cape.cli.add_global_options`,
:func:`cape.cli.run_command`). The benchmarks themselves live in :mod:`cape_benchmarks`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from cape.cli import _Parser, add_global_options, run_command

from . import (
    attention_command,
    baselines_command,
    causal_command,
    causal_scale_command,
    edge_confidence_command,
    embedding_command,
    encodings_command,
    gears_command,
    intervention_command,
    non_relativity_command,
    paper_runtime_command,
    perturbation_dag_command,
    pretrain_command,
    properties_command,
    recipe_command,
    throughput_command,
)

#: In the order ``cape-bench --help`` lists them.
BENCH_MODULES = (attention_command, non_relativity_command, causal_command, causal_scale_command,
                 intervention_command, pretrain_command, embedding_command, properties_command, baselines_command,
                 recipe_command, encodings_command, gears_command, paper_runtime_command,
                 throughput_command, edge_confidence_command, perturbation_dag_command)


PROG = "cape-bench"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Benchmarks of cape: each writes JSON records, a markdown table and a "
                                            "plot (results/bench/<name>.* unless --out says otherwise).")
    add_global_options(parser)
    bench = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", parser_class=_Parser)
    bench.required = True
    for module in BENCH_MODULES:
        module.register(bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cape-bench`` console script."""
    args = build_parser().parse_args(argv)
    args.command = "bench"
    return run_command(args, prog=PROG)
