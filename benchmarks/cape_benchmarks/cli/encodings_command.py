"""``cape-bench encodings``: every positional encoding × backbone × seed on annotation, clustering or perturbation,
with CAPE's ablations and the task baselines (paper Tables 2, 3, S1, S2)."""

from __future__ import annotations

import argparse
import logging

from cape._errors import CapeInputError
from cape._settings import settings as cape_settings
from cape.cli._command_io import max_len_value, tau_value
from cape.models.modules.backbone import INTEGRATIONS

from ..encodings import run_encodings_benchmark
from ..encodings_models import BACKBONES, TASKS, BenchSettings, variants
from ._data import add_run_options, dataset_keys, dataset_name, load_dataset, perturbation_data


def _mode_note() -> str:
    """The two presets in words, read from :class:`BenchSettings` so that the help cannot drift from the code."""

    def words(s) -> str:
        return (f"{s.n_genes} genes, d_model {s.d_model} / {s.n_heads} heads, ≤ {s.max_len} tokens/cell, "
                f"{s.pretrain_epochs} pretraining epochs (annotation: {s.annotation_pretrain_epochs}), fine-tuning ≤ "
                f"{s.fine_tune_epochs} epochs with early stopping (patience {s.fine_tune_patience}), Step I "
                f"{s.causal_epochs} epochs τ {s.causal_tau}, Step II d {s.embed_dim} / {s.embed_epochs} epochs, "
                f"predictor {s.predictor_epochs} epochs")

    return (f"--quick: 1 seed, {words(BenchSettings.for_mode(True))} (full: 3 seeds, "
            f"{words(BenchSettings.for_mode(False))})")


def register(bench) -> None:
    mode_note = _mode_note()
    p = bench.add_parser("encodings", help="every positional encoding × scGPT/scBERT × seeds on a task, with CAPE "
                                           "ablations and baselines (paper Tables 2, 3, S1, S2)",
                         description="Writes <out>/<task>_<dataset>.{json,md,png}. " + mode_note + ".")
    p.add_argument("--task", choices=TASKS, required=True)
    p.add_argument("--dataset", required=True,
                   help="a registered dataset (cape data list), 'simulated' (perturbation), 'simulated_grn' (cell "
                        "types and knock-outs on a known DAG: every task, with the oracle rows) or an .h5ad path")
    p.add_argument("--label-key", default=None, help="obs column with labels (default: the dataset manifest's)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="model seeds (default 0 1 2; --quick: 0)")
    p.add_argument("--encodings", nargs="+", default=None,
                   help="encodings and ablations (default: all of `cape encodings` + cape_null, cape_wo_csl, "
                        "cape_wo_hyperbolic, cape_wo_rotary); 'default' runs each backbone's own default only; "
                        "cape_oracle / rope_oracle / cape_paper_oracle use the data's true DAG (simulations); "
                        "controls: cape_oracle_random_directions, cape_oracle_permuted, rope_random_order")
    p.add_argument("--backbones", nargs="+", default=list(BACKBONES), help="scgpt and/or scbert (both)")
    p.add_argument("--score-on", choices=["test", "validation"], default="test",
                   help="annotation: score the 70 %% test cells (default), or fine-tune on half of the 30 %% "
                        "fine-tune cells and score the other half (for choosing settings without the test cells)")
    p.add_argument("--integrations", nargs="+", choices=list(INTEGRATIONS), default=list(INTEGRATIONS),
                   help="complement (the backbone keeps its gene embedding) and/or replace (the encoding takes its "
                        "place, CAPE Supp. F.2); default both")
    add_run_options(p, mode_note)
    p.add_argument("--name", default=None, help="output file stem (default <task>_<dataset>)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1; fastest on a shared CPU)")
    p.add_argument("--jobs", type=int, default=1,
                   help="models trained at once in worker processes, each with --threads threads (1); e.g. the "
                        "number of cores: same results, the full tables in a fraction of the time")
    p.add_argument("--positions-seed", type=int, default=0, help="seed of Steps I-III, shared by all runs (0)")
    for flag, kind, what in [("--n-genes", int, "genes kept (most dispersed)"), ("--d-model", int, "model width"),
                             ("--n-layers", int, "layers"), ("--n-heads", int, "attention heads"),
                             ("--max-len", max_len_value, "tokens per cell incl. <cls>, or 'auto'"),
                             ("--batch-size", int, "cells per training step"),
                             ("--lr", float, "learning rate (pretraining and fine-tuning)"),
                             ("--pretrain-epochs", int, "masked-value epochs"),
                             ("--annotation-pretrain-epochs", int, "masked-value epochs before annotation "
                                                                   "fine-tuning"),
                             ("--fine-tune-epochs", int, "annotation fine-tuning epochs"),
                             ("--causal-epochs", int, "Step I epochs"),
                             ("--causal-tau", tau_value, "Step I threshold τ, or 'budget' / 'auto'"),
                             ("--embed-epochs", int, "Step II epochs"),
                             ("--embed-dim", int, "Step II dimension (default: d_model / (2·bands))"),
                             ("--bands", int, "Step III bands per coordinate (cape_paper rows keep one)"),
                             ("--band-top", float, "multiplier of Step III's highest band"),
                             ("--predictor-epochs", int, "perturbation predictor epochs")]:
        p.add_argument(flag, type=kind, default=None, help=f"{what} (default: the mode's preset)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    variants(args.encodings)  # unknown names fail before any data is loaded
    name = dataset_name(args.dataset)
    label_key = None
    if args.task == "perturbation":
        adata = perturbation_data(args.dataset, args.quick)
    else:
        adata = load_dataset(args.dataset, args.task, args.quick)
        label_key, _ = dataset_keys(adata, args)
        if label_key is None:
            raise CapeInputError(f"dataset {name} has no label key in its manifest; pass --label-key")
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    overrides = {k: getattr(args, k) for k in ("n_genes", "d_model", "n_layers", "n_heads", "max_len", "batch_size",
                                               "lr", "pretrain_epochs", "annotation_pretrain_epochs",
                                               "fine_tune_epochs", "causal_epochs", "causal_tau", "embed_epochs",
                                               "embed_dim", "bands", "band_top", "predictor_epochs")}
    bench_settings = BenchSettings.for_mode(args.quick, annotation_score_on=args.score_on, **overrides)
    device = cape_settings.device or "auto"
    result = run_encodings_benchmark(adata, args.task, dataset=name, label_key=label_key,
                                     encoding_names=args.encodings, backbones=args.backbones, seeds=seeds,
                                     quick=args.quick, settings=bench_settings, out=args.out, name=args.name,
                                     positions_seed=args.positions_seed, threads=args.threads, device=device,
                                     jobs=args.jobs, integrations=args.integrations)
    logging.getLogger("cape").info("wrote %s (%.1f min)", ", ".join(map(str, result.paths.values())),
                                   result.seconds / 60)
    return 0
