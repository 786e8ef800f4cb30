"""``cape bench <name>``: one module per benchmark command, each with ``register(bench)`` adding its parser (with
``set_defaults(func=run)``) to the ``cape bench`` group. The benchmarks themselves live in :mod:`cape.bench`."""

from __future__ import annotations

from . import (
    attention,
    baselines,
    causal,
    causal_scale,
    embedding,
    encodings,
    gears,
    intervention,
    non_relativity,
    paper_runtime,
    pretrain,
    properties,
    recipe,
)

#: In the order ``cape bench --help`` lists them.
BENCH_MODULES = (attention, non_relativity, causal, causal_scale, intervention, pretrain, embedding, properties,
                 baselines, recipe, encodings, gears, paper_runtime)


def register(commands) -> None:
    parser = commands.add_parser("bench", help="run a benchmark (writes JSON, markdown and a plot)")
    bench = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", parser_class=type(parser))
    bench.required = True
    for module in BENCH_MODULES:
        module.register(bench)
