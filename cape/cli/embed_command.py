"""``cape embed``: Step II on a file, the DAG (or a given gene graph) embedded in hyperbolic space."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

from .._errors import CapeInputError
from .._io import write_h5ad
from ..hyperbolic.embedding_config import DEFAULT_TEMPERATURE, EmbeddingConfig
from ..tl._hyperbolic_embedding import hyperbolic_embedding
from ._command_io import check_output, read_input


def _negatives(value: str):
    if value in ("auto", "exact"):
        return None if value == "exact" else "auto"
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto', 'exact' or a positive integer, got {value!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of negatives, got {count}")
    return count


def register(commands) -> None:
    embed = commands.add_parser("embed", help="Step II: embed varp['cape_dag'] in hyperbolic space")
    embed.add_argument("--input", "-i", required=True, help="input .h5ad with varp['cape_dag'] (from `cape causal`)")
    embed.add_argument("--output", "-o", required=True, help="output .h5ad")
    embed.add_argument("--adjacency", default=None, metavar="FILE",
                       help="your own gene graph instead of varp['cape_dag']: genes × genes .npy/.npz in var_names "
                            "order, or .csv with gene names as header and index (A[i, j] ≠ 0: gene i → gene j; "
                            "must be a DAG)")
    embed.add_argument("--dim", type=int, default=32, help="embedding dimension d (32)")
    embed.add_argument("--k-hop", type=int, default=2, help="positives: directed paths of ≤ k edges (2)")
    embed.add_argument("--lambda-g", type=float, default=0.1, help="generality regulariser weight (0.1)")
    embed.add_argument("--restart", type=float, default=0.15, help="PageRank restart weight (0.15)")
    embed.add_argument("--epochs", type=int, default=1000, help="optimisation steps (1000)")
    embed.add_argument("--optimizer", choices=["rsgd", "radam"], default="rsgd")
    embed.add_argument("--geometry", choices=["hyperbolic", "euclidean"], default="hyperbolic")
    embed.add_argument("--lr", type=float, default=None, help="learning rate (default per optimizer)")
    embed.add_argument("--negatives", type=_negatives, default="auto",
                       help="'exact', 'auto' (exact up to 1,500 genes) or K sampled negatives per gene")
    embed.add_argument("--max-radius", type=float, default=7.0, help="largest distance from the origin (7)")
    embed.add_argument("--init-scale", type=float, default=1e-3,
                       help="standard deviation of the starting coordinates around the origin (1e-3)")
    embed.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                       help="τ dividing the contrastive term's distances (default 0.5; 1 = the paper's Eq. 16)")
    embed.add_argument("--isolated", choices=["negatives", "origin"], default="negatives",
                       help="genes without an edge: spread apart as Step II negatives (default) or left at the origin")
    embed.add_argument("--positive-weights", choices=["path", "per_anchor"], default="path",
                       help="Eq. 16's positive weights as they are (default), or divided by each gene's sum "
                            "(per_anchor: hubs are not pushed to the rim)")
    embed.set_defaults(func=run_embed)


def config_from_args(args: argparse.Namespace) -> EmbeddingConfig:
    """The :class:`~cape.hyperbolic.EmbeddingConfig` of ``cape embed``'s flags (one flag per field)."""
    return EmbeddingConfig(dim=args.dim, k_hop=args.k_hop, lambda_g=args.lambda_g, restart=args.restart,
                           epochs=args.epochs, lr=args.lr, optimizer=args.optimizer, geometry=args.geometry,
                           negatives=args.negatives, max_radius=args.max_radius, init_scale=args.init_scale,
                           temperature=args.temperature, isolated=args.isolated,
                           positive_weights=args.positive_weights)


def run_embed(args: argparse.Namespace) -> int:
    out = check_output(args.output, args.input, getattr(args, "adjacency", None))
    config = config_from_args(args)
    adata = read_input(args.input, expect_counts=False)
    adjacency = None if args.adjacency is None else read_adjacency(args.adjacency, adata.var_names)
    hyperbolic_embedding(adata, config, adjacency=adjacency, device=None, seed=None)
    write_h5ad(adata, out)
    return 0


def read_adjacency(path: str, var_names):
    """A user's gene × gene adjacency: ``.npy``/``.npz`` (dense or scipy sparse, rows = var_names) or ``.csv``
    (header and index = gene names, reordered to var_names; genes absent from the file get no edges)."""

    p = Path(path)
    if not p.is_file():
        raise CapeInputError(f"--adjacency file not found: {p}")
    suffix = p.suffix.lower()
    try:
        if suffix == ".npz":
            try:
                matrix = sp.load_npz(p)
            except (ValueError, KeyError):  # a plain np.savez archive with one array
                with np.load(p) as archive:
                    matrix = archive[archive.files[0]]
        elif suffix == ".npy":
            matrix = np.load(p, allow_pickle=False)
        elif suffix == ".csv":
            frame = pd.read_csv(p, index_col=0)
        else:
            raise CapeInputError(f"--adjacency must be a .npy, .npz or .csv file, got {p.name}")
    except CapeInputError:
        raise
    except Exception as err:  # numpy/pandas raise many types for damaged files
        raise CapeInputError(f"cannot read --adjacency {p} ({type(err).__name__})") from err
    if suffix == ".csv":
        if frame.shape[0] != frame.shape[1]:
            raise CapeInputError(f"--adjacency {p.name} is {frame.shape[0]}×{frame.shape[1]}; it must be square "
                                 "(genes × genes)")
        names = pd.Index(frame.index.astype(str))
        if list(names) != list(frame.columns.astype(str)):
            raise CapeInputError(f"--adjacency {p.name}: the header and the first column must list the same genes "
                                 "in the same order")
        unknown = names.difference(var_names)
        if len(unknown):
            raise CapeInputError(f"--adjacency {p.name}: {len(unknown)} gene(s) not in the data, e.g. {unknown[0]!r}")
        rows = pd.Index(var_names).get_indexer(names)
        values = frame.to_numpy(dtype=float)
        matrix = np.zeros((len(var_names), len(var_names)))
        matrix[np.ix_(rows, rows)] = values
        return matrix
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise CapeInputError(f"--adjacency {p.name} has shape {'×'.join(map(str, matrix.shape))}; it must be "
                             "square (genes × genes)")
    return matrix
