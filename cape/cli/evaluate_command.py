"""``cape evaluate``: metrics of a trained run against baselines, and the run's markdown report."""

from __future__ import annotations

import argparse
import os

from .. import data
from .._errors import CapeInputError
from .._settings import resolve_seed
from ..report import attention_records, evaluate_run, figures_dir, write_figures, write_metrics, write_report
from ..report.resources import own_resources, resource_records, stage_resources
from ..tasks.labels import resolve_label_key
from ._command_io import check_output


def register(commands) -> None:
    parser = commands.add_parser("evaluate", help="metrics of a trained run (annotation, clustering) and a report")
    parser.add_argument("--input", "-i", required=True, help="trained .h5ad (from `cape train`)")
    parser.add_argument("--metrics", required=True, help="output metrics .json (records)")
    parser.add_argument("--report", required=True, help="output report .md (figures go to <stem>_figures/)")
    parser.add_argument("--label-key", default="auto",
                        help="obs column with cell labels; 'auto' (default) = the dataset's, 'none' = no labels")
    parser.add_argument("--name", default=None, help="run name shown in the report and the records")
    parser.add_argument("--model", default=None,
                        help="trained model folder (from `cape train --model-dir`): adds the per-layer attention "
                             "non-relativity (Behind RoPE) to the metrics")
    parser.add_argument("--benchmarks", default=None, metavar="DIR",
                        help="folder of Snakemake's benchmark files of the earlier stages (<stage>.tsv, e.g. "
                             "logs/<run>): their time and peak memory go into the report's verdict and the "
                             "metrics; a missing file reads 'not measured'")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_output(args.metrics, args.input, args.model, suffix=".json", option="--metrics")
    check_output(args.report, args.input, args.model, args.metrics, suffix=".md", option="--report")
    adata = data.read(args.input, expect_counts=False)
    if "X_cape" not in adata.obsm:
        raise CapeInputError(f"{args.input} has no obsm['X_cape'] (cell embeddings): run `cape train` first")
    label_key = resolve_label_key(adata, None if args.label_key == "none" else args.label_key)
    if args.benchmarks is not None and not os.path.isdir(args.benchmarks):
        raise CapeInputError(f"--benchmarks {args.benchmarks}: no such folder")
    name = args.name or adata.uns.get("cape", {}).get("dataset", {}).get("name", "data")
    seed = resolve_seed(None)
    records = evaluate_run(adata, label_key, dataset=name, seed=seed)
    if args.model is not None:

        records += attention_records(adata, args.model, dataset=name, seed=seed)
    figures = write_figures(adata, figures_dir(args.report), label_key=label_key)
    # Measured last, so this process's peak includes the metrics and the figures (not the text written after).
    resources = [*stage_resources(args.benchmarks), own_resources("evaluate")]
    records += resource_records(resources, dataset=name, seed=seed)
    write_report(adata, records, args.report, label_key=label_key, title=f"cape run: {name}", figures=figures,
                 resources=resources)
    write_metrics(records, args.metrics)
    return 0
