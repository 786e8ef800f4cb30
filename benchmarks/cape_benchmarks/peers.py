"""Peer causal-discovery methods (gcastle, DAGMA, SDCD), each run in its own subprocess with a time budget.

``import castle.algorithms`` sets torch's default dtype to float64 and configures the root logger, and
``DagmaMLP`` sets the default dtype too; running every peer in a child process keeps cape's own process
clean and lets a run that exceeds its budget be killed. The child is ``python -m cape_benchmarks.peers METHOD
IN.npz OUT.npz``; it writes the weighted adjacency (A[i, j] ≠ 0: i → j) and the fit time.

SDCD and DCD-FG (package ``sdcd``) pin pandas < 2 and an old wandb, so they live in an environment of their
own (``make sdcd-env`` builds ``.venv-sdcd``): their child is the stand-alone script ``_sdcd_child.py`` run
by that environment's interpreter (:func:`sdcd_python`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

__all__ = ["INTERVENTIONAL_PEERS", "PEERS", "PeerResult", "run_peer"]

logger = logging.getLogger("cape")

#: Peer name → short description (settings are each library's defaults unless noted in ``_fit``).
PEERS = {
    "notears": "gcastle Notears (linear, L-BFGS-B)",
    "notears_low_rank": "gcastle NotearsLowRank (rank max(2, M // 5))",
    "dag_gnn": "gcastle DAG_GNN (variational, like cape)",
    "golem": "gcastle GOLEM (equal variances)",
    "notears_nonlinear": "gcastle NotearsNonlinear (MLP)",
    "dagma_linear": "DAGMA DagmaLinear (l2)",
    "dagma_linear_counts": "DAGMA DagmaLinear (l2, lambda1 0.03, w_threshold 0.05, z-scored input: issue 31's setting)",
    "dagma_mlp": "DAGMA DagmaMLP + DagmaNonlinear (hidden 10)",
    "sdcd": "SDCD (Nazaret et al. 2024; sdcd 0.1.4 defaults, own environment)",
    "sdcd_labels": "SDCD with the cells' intervention labels (each cell's perturbed genes), where the data have them",
    "dcdfg": "DCD-FG (sdcd 0.1.4's wrapper, defaults; needs pytorch_lightning, own environment)",
    "grnboost2": "GRNBoost2 (arboreto 0.1.6, every gene a candidate regulator; own environment): its importances "
                 "rank every ordered pair, its graph is the top pairs, as many as cape's edge budget",
}
#: Peers from the ``sdcd`` package, run by :func:`sdcd_python` on ``_sdcd_child.py``.
SDCD_PEERS = ("sdcd", "sdcd_labels", "dcdfg")
#: Peers that take the cells' intervention labels (a cells × variables mask of the perturbed variables).
INTERVENTIONAL_PEERS = ("sdcd_labels",)
#: Peers whose output scores every ordered pair rather than a graph: cut at cape's edge budget for the graph.
RANKING_PEERS = ("grnboost2",)
#: Environment variable naming the interpreter of an environment with ``sdcd`` installed.
SDCD_PYTHON_ENV = "CAPE_SDCD_PYTHON"
#: Environment variable naming the interpreter of an environment with ``arboreto`` installed.
GRNBOOST2_PYTHON_ENV = "CAPE_GRNBOOST2_PYTHON"
_SDCD_CHILD = Path(__file__).with_name("_sdcd_child.py")
_GRNBOOST2_CHILD = Path(__file__).with_name("_grnboost2_child.py")


def own_environment_python(variable: str, venv: str, module: str) -> str | None:
    """``$variable``, else ``./<venv>/bin/python`` (what its make target builds), else this interpreter if it can
    import ``module``; ``None`` if none can."""
    configured = os.environ.get(variable)
    if configured:
        # the child runs in a scratch folder, so a path relative to where the user typed it must be resolved here
        return str(Path(configured).expanduser().absolute()) if os.sep in configured else configured
    local = Path(venv) / "bin" / "python"
    if local.exists():
        return str(local.absolute())
    return sys.executable if importlib.util.find_spec(module) is not None else None


def sdcd_python() -> str | None:
    """Interpreter that runs the SDCD peers: ``$CAPE_SDCD_PYTHON``, else ``./.venv-sdcd/bin/python`` (what
    ``make sdcd-env`` builds), else this interpreter if it can import ``sdcd``; ``None`` if none can."""
    return own_environment_python(SDCD_PYTHON_ENV, ".venv-sdcd", "sdcd")


def grnboost2_python() -> str | None:
    """Interpreter that runs GRNBoost2: ``$CAPE_GRNBOOST2_PYTHON``, else ``./.venv-grnboost2/bin/python`` (what
    ``make grnboost2-env`` builds), else this interpreter if it can import ``arboreto``; ``None`` if none can."""
    return own_environment_python(GRNBOOST2_PYTHON_ENV, ".venv-grnboost2", "arboreto")


@dataclass
class PeerResult:
    """Outcome of one peer run: ``status`` is ``"ok"``, ``"timeout"`` or ``"error"``."""

    method: str
    status: str
    adjacency: np.ndarray | None
    seconds: float
    message: str = ""


def _fit(method: str, X: np.ndarray, seed: int) -> np.ndarray:
    """Run one peer on X in this (child) process and return its weighted adjacency."""

    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (the peers draw from NumPy's global generator)
    torch.manual_seed(seed)
    d = X.shape[1]
    if method.startswith("dagma"):
        if method == "dagma_linear":
            from dagma.linear import DagmaLinear  # optional dependency (extra `peers`)

            return np.asarray(DagmaLinear(loss_type="l2").fit(X, lambda1=0.02))
        if method == "dagma_linear_counts":
            from dagma.linear import DagmaLinear  # optional dependency (extra `peers`)

            Z = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
            return np.asarray(DagmaLinear(loss_type="l2").fit(Z, lambda1=0.03, w_threshold=0.05))
        from dagma.nonlinear import DagmaMLP, DagmaNonlinear  # optional dependency (extra `peers`)

        model = DagmaMLP(dims=[d, 10, 1], bias=True, dtype=torch.double)
        return np.asarray(DagmaNonlinear(model, dtype=torch.double).fit(X, lambda1=0.02, lambda2=0.005))
    # Only in the child process: importing castle.algorithms sets torch's default dtype and the root logger.
    import castle.algorithms as algorithms

    if method == "notears":
        model = algorithms.Notears()
        model.learn(X)
    elif method == "notears_low_rank":
        model = algorithms.NotearsLowRank()
        model.learn(X, rank=max(2, d // 5))
    elif method == "dag_gnn":
        model = algorithms.DAG_GNN(seed=seed)
        model.learn(X)
    elif method == "golem":
        model = algorithms.GOLEM(seed=seed)
        model.learn(X)
    elif method == "notears_nonlinear":
        model = algorithms.NotearsNonlinear()
        model.learn(X)
    else:
        raise ValueError(f"unknown peer {method!r}; known: {sorted(PEERS)}")
    weighted = getattr(model, "weight_causal_matrix", None)
    binary = np.asarray(model.causal_matrix, dtype=np.float64)
    if weighted is None:
        return binary
    weighted = np.asarray(weighted, dtype=np.float64)
    # Keep the peer's own thresholding: weights only where its causal_matrix has an edge.
    return np.where(binary != 0, weighted, 0.0) if weighted.shape == binary.shape else binary


def run_peer(method: str, X: np.ndarray, *, budget: float, seed: int = 0, threads: int = 1,
             intervened: np.ndarray | None = None) -> PeerResult:
    """Fit ``method`` on X (samples × variables) in a subprocess; kill it after ``budget`` seconds.

    ``intervened``: samples × variables bool mask of each sample's perturbed variables, given to the
    :data:`INTERVENTIONAL_PEERS` (without it they see every sample as observational) and ignored by the others.
    """
    if method not in PEERS:
        raise ValueError(f"unknown peer {method!r}; known: {sorted(PEERS)}")
    if intervened is not None:
        intervened = (intervened.toarray() if sp.issparse(intervened) else np.asarray(intervened)).astype(bool)
        if intervened.shape != np.shape(X):
            raise ValueError(f"intervened has shape {intervened.shape}, X {np.shape(X)}")
    command = [sys.executable, "-m", "cape_benchmarks.peers"]
    if method in SDCD_PEERS:
        python = sdcd_python()
        if python is None:
            return PeerResult(method, "error", None, 0.0, f"sdcd is not installed: run `make sdcd-env` or set "
                              f"{SDCD_PYTHON_ENV} to the python of an environment with sdcd==0.1.4")
        command = [python, str(_SDCD_CHILD)]
    elif method == "grnboost2":
        python = grnboost2_python()
        if python is None:
            return PeerResult(method, "error", None, 0.0, f"arboreto is not installed: run `make grnboost2-env` or "
                              f"set {GRNBOOST2_PYTHON_ENV} to the python of an environment with arboreto==0.1.6")
        command = [python, str(_GRNBOOST2_CHILD)]
    with tempfile.TemporaryDirectory(prefix="cape-peer-") as tmp:
        src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        labels = {"intervened": intervened} if intervened is not None and method in INTERVENTIONAL_PEERS else {}
        np.savez(src, X=np.asarray(X, dtype=np.float64), seed=seed, **labels)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
               "WANDB_MODE": "disabled"}
        start = time.perf_counter()
        # DCD-FG's pytorch_lightning trainer writes checkpoints/ and dask its worker space into the working
        # directory: keep them in tmp.
        own_folder = method in SDCD_PEERS or method == "grnboost2"
        proc = subprocess.Popen([*command, method, str(src), str(dst)], cwd=tmp if own_folder else None,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            logger.info("%s: over its %.0f s budget, stopped", method, budget)
            return PeerResult(method, "timeout", None, time.perf_counter() - start, f"exceeded {budget:.0f} s")
        wall = time.perf_counter() - start
        if proc.returncode != 0 or not dst.exists():
            tail = output.decode(errors="replace").strip().splitlines()[-1:] if output else []
            logger.info("%s failed: %s", method, tail)
            return PeerResult(method, "error", None, wall, tail[0] if tail else f"exit {proc.returncode}")
        result = np.load(dst)
        return PeerResult(method, "ok", result["W"], float(result["seconds"]))


def _main(argv: list[str]) -> int:
    method, src, dst = argv
    data = np.load(src)
    X, seed = data["X"], int(data["seed"])
    start = time.perf_counter()
    W = _fit(method, X, seed)
    seconds = time.perf_counter() - start
    np.savez(dst, W=np.asarray(W, dtype=np.float64), seconds=seconds)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
