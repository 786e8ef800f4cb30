"""``cape-bench paper-runtime``: expected run time of benchmark configs (``configs/benchmarks/paper_*.yaml``) from
per-step costs measured on this machine."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import yaml

from cape._errors import CapeInputError
from cape._io import write_json, write_text

from ..paper_runtime import DATASET_CELLS, estimate_configs, runtime_markdown
from ._data import DEFAULT_OUT


def register(bench) -> None:
    p = bench.add_parser("paper-runtime", help="expected run time of benchmark configs from measured per-step "
                                               "costs (estimates; CPU)",
                         description="Measures each config's transformer size at a few short token counts and its "
                                     "Steps I-II at its gene count, extrapolates to the config's epochs, cells and "
                                     "max_len, and writes <out>/<name>.{json,md}.")
    p.add_argument("configs", nargs="+", help="benchmark config YAML files")
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 1200],
                   help="tokens per cell at which a training/forward batch is timed (128 512 1200: up to the "
                        "configs' max_len, so that nothing is extrapolated in T)")
    p.add_argument("--steps", type=int, default=2, help="batches timed per token count (2)")
    p.add_argument("--repeats", type=int, default=2, help="timings per token count; the fastest is kept (2)")
    p.add_argument("--cells", type=int, default=256, help="cells for the Step I/II timing (256)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder ({DEFAULT_OUT})")
    p.add_argument("--name", default="paper_runtime", help="output file stem (paper_runtime)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if len(args.tokens) < 3 or min(args.tokens) < 2 or args.steps < 1 or args.repeats < 1 or args.cells < 2:
        raise CapeInputError("--tokens needs at least 3 values ≥ 2, --steps and --repeats ≥ 1, --cells ≥ 2")
    configs = {}
    for path in map(Path, args.configs):
        if not path.is_file():
            raise CapeInputError(f"config not found: {path}")
        bench = (yaml.safe_load(path.read_text()) or {}).get("benchmark") or {}
        if bench.get("dataset") not in DATASET_CELLS:
            raise CapeInputError(f"{path}: dataset {bench.get('dataset')!r} has no known size; known: "
                                 f"{', '.join(DATASET_CELLS)}")
        configs[path.stem] = {"benchmark": bench}
    result = estimate_configs(configs, tokens=args.tokens, steps=args.steps,
                              repeats=args.repeats, cells=args.cells)
    records = [{"kind": "estimate", "config": name, **parts} for name, parts in result["estimates"].items()]
    records += [{**m, "kind": "measurement", "measured": m["kind"]} for m in result["measurements"]]
    records.append({"kind": "machine", **result["machine"]})
    stem = Path(args.out) / args.name
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [write_json(records, stem.with_suffix(".json")), write_text(runtime_markdown(result),
                                                                        stem.with_suffix(".md"))]
    logging.getLogger("cape").info("wrote %s", ", ".join(map(str, paths)))
    return 0
