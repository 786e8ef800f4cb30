"""``cape.tl.causal_graph``: Step I on an AnnData — the weighted causal gene DAG in ``varp["cape_dag"]``."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import anndata as ad
import numpy as np
import scipy.sparse as sp

from .._errors import CapeInputError
from .._settings import resolve_device, resolve_seed, seed_everything

__all__ = ["MIN_CELLS", "causal_graph"]

logger = logging.getLogger("cape")

#: Refuse to fit a graph on fewer cells than this (fewer cells than genes only warns).
MIN_CELLS = 10


def _select_genes(adata: ad.AnnData, use_genes) -> np.ndarray:
    """Boolean mask over ``adata.var_names`` of the genes to use."""
    if use_genes is None:
        return np.ones(adata.n_vars, dtype=bool)
    if isinstance(use_genes, str):
        if use_genes not in adata.var:
            if use_genes == "cape_used":
                logger.info("var['cape_used'] not found: using all %d genes", adata.n_vars)
                return np.ones(adata.n_vars, dtype=bool)
            raise CapeInputError(f"use_genes={use_genes!r}: no such boolean column in adata.var")
        column = adata.var[use_genes]
        if column.dtype != bool:
            raise CapeInputError(f"adata.var[{use_genes!r}] must be boolean, got dtype {column.dtype}")
        return column.to_numpy(dtype=bool)
    values = np.asarray(use_genes)
    if values.dtype == bool:
        if values.shape != (adata.n_vars,):
            raise CapeInputError(f"use_genes mask has length {values.size}, expected n_vars = {adata.n_vars}")
        return values
    names = [str(v) for v in values]
    missing = [n for n in names if n not in adata.var_names]
    if missing:
        raise CapeInputError(f"use_genes: {len(missing)} gene(s) not in var_names, e.g. {missing[0]!r}")
    return adata.var_names.isin(names)


def _check_parameters(rank, tau, lambda_sparse, epochs, batch_size, lr, h_every=None) -> None:
    if not (isinstance(tau, (int, float)) and np.isfinite(tau) and 0.0 <= tau < 1.0):
        raise CapeInputError(f"tau must be in [0, 1), got {tau!r}")
    if rank is not None and (not isinstance(rank, (int, np.integer)) or rank < 1):
        raise CapeInputError(f"rank must be a positive integer or None (dense), got {rank!r}")
    if not (np.isfinite(lambda_sparse) and lambda_sparse >= 0):
        raise CapeInputError(f"lambda_sparse must be ≥ 0, got {lambda_sparse!r}")
    if not (isinstance(epochs, (int, np.integer)) and epochs >= 1):
        raise CapeInputError(f"epochs must be a positive integer, got {epochs!r}")
    if not (isinstance(batch_size, (int, np.integer)) and batch_size >= 1):
        raise CapeInputError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not (np.isfinite(lr) and lr > 0):
        raise CapeInputError(f"lr must be > 0, got {lr!r}")
    if h_every is not None and not (isinstance(h_every, (int, np.integer)) and h_every >= 1):
        raise CapeInputError(f"h_every must be a positive integer or None (automatic), got {h_every!r}")


def causal_graph(
    adata: ad.AnnData,
    rank: int | None = 40,
    tau: float = 0.2,
    lambda_sparse: float = 1.0,
    epochs: int = 100,
    batch_size: int = 128,
    lr: float = 3e-3,
    device: str = "auto",
    seed: int | None = 0,
    use_genes: str | Sequence[str] | np.ndarray | None = "cape_used",
    copy: bool = False,
    *,
    layer: str | None = None,
    key_added: str = "cape_dag",
    h_every: int | None = None,
) -> ad.AnnData | None:
    """Learn the causal gene graph (CAPE Step I: variational NOTEARS, paper Sec. 3.3).

    Parameters
    ----------
    adata
        Cells × genes; X (or ``layer``) preprocessed (e.g. log-normalised), dense or sparse, no NaN.
    rank
        Rank r of A = UVᵀ. ``None``, or r ≥ the number of genes, uses a dense A (logged).
    tau
        Edge threshold τ ∈ [0, 1): |A_ij| ≤ τ is dropped (paper default 0.2).
    lambda_sparse
        λs of the L1 penalty (see :func:`cape.causal.fit_variational_notears` for its scaling).
    epochs, batch_size, lr
        AdamW training (paper: 100, 128, 3e-3); training stops earlier once h has converged.
    device
        ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``.
    seed
        Seeds initialisation, minibatch order and sampling (same seed, same graph on CPU).
    use_genes
        Boolean ``var`` column (default ``"cape_used"``; all genes when it is absent), a boolean mask, a list
        of gene names, or ``None`` for all genes. Constant genes among them are dropped with a warning.
    copy
        Return a modified copy instead of writing into ``adata``.
    layer
        Use ``adata.layers[layer]`` instead of X.
    key_added
        ``varp`` key of the result.
    h_every
        Steps between exact evaluations of the acyclicity penalty; in between it uses its first-order
        model (see :func:`cape.causal.fit_variational_notears`). ``None``: exact every step while the
        exponential is small (min(genes, r(r+1)/2) ≤ 256), else every 10 steps; 1: always exact.

    Returns
    -------
    ``None`` (or the copy). Sets
    ``varp[key_added]``: CSR float32 n_vars × n_vars, A[i, j] ≠ 0 means gene i → gene j, always a DAG,
    zero outside the genes used;
    ``var["cape_used"]``: the genes that took part in the graph;
    ``uns["cape"]["causal_graph"]``: parameters, seed, per-epoch loss/h/ρ/α, wall time, number of edges
    and of edges removed to break cycles, dropped constant genes.

    Raises
    ------
    CapeInputError
        τ outside [0, 1), NaN/inf values, fewer than :data:`MIN_CELLS` cells, fewer than two usable genes,
        or invalid parameters. Fewer cells than genes only warns.
    """
    from ..causal import fit_variational_notears, make_dag
    from ..causal.trainer import gene_moments

    start = time.perf_counter()
    _check_parameters(rank, tau, lambda_sparse, epochs, batch_size, lr, h_every)
    if layer is not None and layer not in adata.layers:
        raise CapeInputError(f"layer {layer!r} not found in adata.layers")
    if copy:
        adata = adata.copy()
    mask = _select_genes(adata, use_genes)
    X = adata.layers[layer] if layer is not None else adata.X
    if X is None:
        raise CapeInputError("adata.X is empty")
    X = X[:, np.flatnonzero(mask)]
    X = sp.csr_matrix(X, dtype=np.float32) if sp.issparse(X) else np.asarray(X, dtype=np.float32)
    values = X.data if sp.issparse(X) else X
    if not np.all(np.isfinite(values)):
        if sp.issparse(X):
            bad_col = int(X.indices[~np.isfinite(X.data)][0])
        else:
            bad_col = int(np.flatnonzero((~np.isfinite(X)).any(axis=0))[0])
        gene = adata.var_names[np.flatnonzero(mask)][bad_col]
        raise CapeInputError(f"X has NaN or infinite values (e.g. gene {gene!r}): impute or filter them first")
    n_cells = X.shape[0]
    if n_cells < MIN_CELLS:
        raise CapeInputError(f"causal_graph needs at least {MIN_CELLS} cells, got {n_cells}")

    genes = np.asarray(adata.var_names[mask])
    _, std = gene_moments(X)
    constant = std <= 1e-12
    if constant.any():
        names = genes[constant]
        shown = ", ".join(map(str, names[:10])) + (f" … ({len(names)} in all)" if len(names) > 10 else "")
        logger.warning("dropping %d constant gene(s) from the causal graph: %s", len(names), shown)
        keep = ~constant
        X = X[:, np.flatnonzero(keep)]
        genes = genes[keep]
    n_genes = genes.size
    if n_genes < 2:
        raise CapeInputError(f"a causal graph needs at least 2 non-constant genes, got {n_genes}"
                             + (f" ({genes[0]})" if n_genes == 1 else ""))
    if n_cells < n_genes:
        logger.warning("fewer cells (%d) than genes (%d): the graph will be poorly determined", n_cells, n_genes)
    rank_used = rank
    if rank is not None and rank >= n_genes:
        logger.warning("rank %d ≥ number of genes %d: using a dense adjacency instead", rank, n_genes)
        rank_used = None

    seed = seed_everything(resolve_seed(seed))
    dev = resolve_device(device)
    try:
        fit = fit_variational_notears(X, rank=rank_used, lambda_sparse=lambda_sparse, epochs=epochs,
                                      batch_size=batch_size, lr=lr, device=dev, seed=seed, h_every=h_every)
    except FloatingPointError as err:
        raise CapeInputError(f"{err}; try a smaller lr (got {lr}) or check X for extreme values") from err
    dag, removed = make_dag(fit.adjacency, tau)
    if removed:
        logger.info("removed %d edge(s) to break cycles left after thresholding", removed)

    index = adata.var_names.get_indexer(genes)
    rows, cols = np.nonzero(dag)
    full = sp.csr_matrix((dag[rows, cols].astype(np.float32), (index[rows], index[cols])),
                         shape=(adata.n_vars, adata.n_vars))
    adata.varp[key_added] = full
    adata.var["cape_used"] = adata.var_names.isin(genes)
    import torch

    from .. import __version__

    record = {
        "params": {"rank": "dense" if rank is None else int(rank), "tau": float(tau),
                   "lambda_sparse": float(lambda_sparse), "epochs": int(epochs), "batch_size": int(batch_size),
                   "lr": float(lr), "device": str(device), "seed": int(seed),
                   "use_genes": use_genes if isinstance(use_genes, str) else "custom",
                   "layer": layer or "X", "key_added": key_added,
                   "h_every": "auto" if h_every is None else int(h_every)},
        "rank_used": "dense" if rank_used is None else int(rank_used),
        "device_used": fit.device,
        "n_cells": int(n_cells),
        "n_genes": int(n_genes),
        "n_edges": int(rows.size),
        "removed_cycle_edges": int(removed),
        "dropped_constant_genes": [str(g) for g in np.asarray(adata.var_names[mask])[constant]],
        "epochs_run": int(fit.epochs_run),
        "converged": bool(fit.converged),
        "h_every": int(fit.h_every),
        "compiled_mlp": bool(fit.compiled_mlp),
        "history": {k: np.asarray(v, dtype=np.float64) for k, v in fit.history.items()},
        "fit_seconds": float(fit.wall_time),
        "wall_time": float(time.perf_counter() - start),
        "versions": {"cape": str(__version__), "torch": str(torch.__version__)},
    }
    adata.uns.setdefault("cape", {})["causal_graph"] = record
    logger.info("causal graph: %d genes, %d edges (%d removed to break cycles), %.1f s",
                n_genes, rows.size, removed, record["wall_time"])
    return adata if copy else None
