"""Synthetic data with a known causal graph, simulated by gcastle (``castle.datasets``).

Only ``castle.datasets`` and ``castle.metrics`` are imported in cape's own process, through
:func:`import_castle`, which undoes gcastle's ``logging.basicConfig`` on the root logger. Never import
``castle.algorithms`` here: it sets torch's global default dtype to float64 (peers run in subprocesses).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import warnings
from collections.abc import Iterator
from types import ModuleType

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

from .._errors import CapeInputError

__all__ = ["castle_quietly", "import_castle", "simulate_sem"]

_GRAPHS = {"scale_free": "scale_free", "erdos_renyi": "erdos_renyi"}
_SEMS = {"linear": ("linear", "gauss"), "mlp": ("nonlinear", "mlp")}


@contextlib.contextmanager
def castle_quietly() -> Iterator[None]:
    """Undo what gcastle does to the root logger (``basicConfig`` at import, ``logging.info`` calls, which
    configure the root logger when it has no handler) inside the block."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        with warnings.catch_warnings():
            # gcastle builds np.matrix objects internally
            warnings.simplefilter("ignore", PendingDeprecationWarning)
            yield
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


def import_castle(module: str) -> ModuleType:
    """Import ``castle.<module>`` (``datasets`` or ``metrics``) without letting it configure logging."""
    if module not in {"datasets", "metrics"}:
        raise ValueError("only castle.datasets and castle.metrics may be imported in cape's process")
    with castle_quietly():
        return importlib.import_module(f"castle.{module}")


def simulate_sem(n_nodes: int, n_edges: int, n_samples: int, graph: str = "scale_free", sem: str = "linear",
                 seed: int = 0, weight_range: tuple[float, float] = (0.5, 2.0),
                 noise_scale: float = 1.0) -> ad.AnnData:
    """Samples from a structural equation model on a random DAG.

    Parameters
    ----------
    n_nodes, n_edges
        Size of the DAG. ``"scale_free"`` is Barabási–Albert with ``round(n_edges / n_nodes)`` edges per new
        node (gcastle needs ``n_nodes ≤ n_edges < n_nodes²``); ``"erdos_renyi"`` has about ``n_edges``.
    n_samples
        Number of observations (cells).
    graph
        ``"scale_free"`` or ``"erdos_renyi"``.
    sem
        ``"linear"`` (Gaussian noise) or ``"mlp"`` (random MLP assignments, Gaussian noise), as in
        gcastle's ``IIDSimulation``.
    seed
        Seeds the graph, the weights and the samples.
    weight_range
        Absolute edge weights are uniform in this range, with random signs.

    Returns
    -------
    AnnData with X (float32, samples × nodes), ``varp["true_dag"]`` (sparse weighted adjacency,
    A[i, j] ≠ 0 means i → j) and ``uns["simulation"]`` (parameters).
    """
    if graph not in _GRAPHS:
        raise CapeInputError(f"graph must be one of {sorted(_GRAPHS)}, got {graph!r}")
    if sem not in _SEMS:
        raise CapeInputError(f"sem must be one of {sorted(_SEMS)}, got {sem!r}")
    if n_nodes < 2 or n_samples < 1:
        raise CapeInputError(f"need n_nodes ≥ 2 and n_samples ≥ 1, got {n_nodes} and {n_samples}")
    if graph == "scale_free" and not n_nodes <= n_edges < n_nodes**2:
        raise CapeInputError(f"scale_free needs n_nodes ≤ n_edges < n_nodes², got {n_nodes} nodes, {n_edges} edges")
    datasets = import_castle("datasets")
    method, sem_type = _SEMS[sem]
    # IIDSimulation draws from NumPy's global generator: seed it and restore the caller's state afterwards.
    state = np.random.get_state()  # noqa: NPY002 (gcastle uses the legacy global generator)
    with castle_quietly():
        W = getattr(datasets.DAG, _GRAPHS[graph])(n_nodes, n_edges, weight_range=weight_range, seed=int(seed))
        try:
            np.random.seed(int(seed) % 2**32)  # noqa: NPY002
            simulation = datasets.IIDSimulation(W=W, n=int(n_samples), method=method, sem_type=sem_type,
                                                noise_scale=noise_scale)
            X = np.asarray(simulation.X, dtype=np.float32)
        finally:
            np.random.set_state(state)  # noqa: NPY002
    names = [f"X{i}" for i in range(n_nodes)]
    adata = ad.AnnData(X=X, obs=pd.DataFrame(index=[f"sample{i}" for i in range(n_samples)]),
                       var=pd.DataFrame(index=names))
    adata.varp["true_dag"] = sp.csr_matrix(np.asarray(W, dtype=np.float32))
    adata.uns["simulation"] = {"n_nodes": int(n_nodes), "n_edges": int(n_edges), "n_samples": int(n_samples),
                               "graph": graph, "sem": sem, "seed": int(seed),
                               "weight_range": list(map(float, weight_range)), "noise_scale": float(noise_scale),
                               "simulator": "gcastle IIDSimulation"}
    return adata
