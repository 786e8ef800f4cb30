"""``cape-bench gears``: GEARS (cell-gears) plain, fed CAPE's gene positions, and fed control embeddings, on the
same perturbation data, split and GO graph (the paper's "gene representations fed into GEARS", Sec. 5.2)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from cape._errors import CapeInputError
from cape._settings import settings as cape_settings
from cape.cli._command_io import tau_value

from ..gears import ARMS, DEFAULT_ARMS, run_gears_benchmark
from ._data import add_run_options, dataset_name, perturbation_data

QUICK_NOTE = ("--quick: the small simulation of `cape-bench encodings --quick` (50 genes), 5 GEARS epochs, Steps "
              "I-III at the encodings benchmark's quick settings; full: the larger simulation (100 genes), 20 "
              "epochs (GEARS' default). Seeds 0 1 in both")


def register(bench) -> None:
    p = bench.add_parser("gears", help="GEARS plain vs GEARS fed CAPE gene positions vs control embeddings "
                                       "(needs the 'gears' extra)",
                         description="Writes <out>/gears_<dataset>.{json,md,png}. " + QUICK_NOTE + ". Needs "
                                     "pip install 'cape[gears]' (cell-gears, torch_geometric).")
    p.add_argument("--dataset", required=True,
                   help="'simulated', a registered perturbation dataset (e.g. sachs2005) or a GEARS-format .h5ad")
    p.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=ARMS,
                   help="plain (GEARS alone), cape (Steps I-III positions), pca (PCA gene loadings), random "
                        "(default: these four); cape_oracle (Steps II-III on the data's known DAG, a reference)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="GEARS seeds (0 1)")
    p.add_argument("--epochs", type=int, default=None, help="GEARS epochs (quick 5, full 20)")
    p.add_argument("--go-graph", default="known",
                   help="GEARS' gene-similarity graph: 'known' (the data's known DAG, as a stand-in for GO), "
                        "'cape_dag' (Step I's DAG), 'empty' (self-loops only), or GEARS' gene2go .pkl / go .csv "
                        "(source,target,importance). Graphs from a DAG replace GO: not the paper's GEARS")
    p.add_argument("--trainable-embeddings", action="store_true",
                   help="let GEARS fine-tune the given embeddings (default: frozen, as representations to evaluate)")
    add_run_options(p, QUICK_NOTE)
    p.add_argument("--name", default=None, help="output file stem (default gears_<dataset>)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1)")
    p.add_argument("--positions-seed", type=int, default=0, help="seed of Steps I-III (0)")
    p.add_argument("--causal-tau", type=tau_value, default=None,
                   help="Step I threshold τ or 'budget' / 'auto' (default: the encodings benchmark's, 'budget')")
    p.add_argument("--causal-epochs", type=int, default=None, help="Step I epochs (default 100)")
    p.add_argument("--n-genes", type=int, default=None,
                   help="genes kept (most dispersed, plus every perturbed gene; default: the encodings benchmark's)")
    p.add_argument("--embed-dim", type=int, default=None, help="Step II dimension (default: the encodings "
                                                               "benchmark's, d_model / 2)")
    p.add_argument("--embed-epochs", type=int, default=None, help="Step II epochs (default: the encodings "
                                                                  "benchmark's)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.epochs is not None and args.epochs < 1:
        raise CapeInputError("--epochs must be at least 1")
    if args.go_graph.endswith((".pkl", ".csv")) and not Path(args.go_graph).is_file():
        raise CapeInputError(f"GO graph file not found: {args.go_graph}")
    name = dataset_name(args.dataset)
    adata = perturbation_data(args.dataset, args.quick)
    result = run_gears_benchmark(adata, dataset=name, arms=args.arms, seeds=args.seeds, quick=args.quick,
                                 epochs=args.epochs, go_graph=args.go_graph,
                                 trainable_embeddings=args.trainable_embeddings, positions_seed=args.positions_seed,
                                 out=args.out, name=args.name, threads=args.threads,
                                 device=cape_settings.device or "auto",
                                 settings_overrides={"causal_tau": args.causal_tau,
                                                     "causal_epochs": args.causal_epochs, "n_genes": args.n_genes,
                                                     "embed_dim": args.embed_dim,
                                                     "embed_epochs": args.embed_epochs})
    logging.getLogger("cape").info("wrote %s (%.1f min)", ", ".join(map(str, result["paths"].values())),
                                   result["seconds"] / 60)
    return 0
