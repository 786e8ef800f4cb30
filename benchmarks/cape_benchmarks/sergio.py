"""SERGIO counts from a known DAG, simulated in SERGIO's own environment (``make sergio-env``).

SERGIO is GPL-3 licensed and cape is MIT, so the simulator runs as a separate program (``_sergio_child.py``) in
an interpreter of its own, found as the other own-environment tools are: ``$CAPE_SERGIO_PYTHON``, else
``./.venv-sergio/bin/python``, else this interpreter if it can import ``SERGIO``.

:func:`simulate_sergio` draws control cells; :func:`simulate_sergio_knockouts` also knock-out cells, made by editing
SERGIO's set-up network in the child (SERGIO 1.9.3 has no perturbation API; ``_sergio_child.py`` says how).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cape._errors import CapeInputError

from .peers import own_environment_python

__all__ = ["SERGIO_PYTHON_ENV", "sergio_python", "simulate_sergio", "simulate_sergio_knockouts"]

#: Environment variable naming the interpreter of an environment with ``sergio-scsim`` installed.
SERGIO_PYTHON_ENV = "CAPE_SERGIO_PYTHON"
_CHILD = Path(__file__).with_name("_sergio_child.py")


def sergio_python() -> str | None:
    """Interpreter that runs SERGIO (see the module docstring); ``None`` if none can."""
    return own_environment_python(SERGIO_PYTHON_ENV, ".venv-sergio", "SERGIO")


def simulate_sergio(weights: np.ndarray, *, n_types: int = 5, cells_per_type: int = 400, seed: int = 0,
                    timeout: float = 1800.0, k_range: tuple[float, float] | None = None,
                    noise: tuple[float, ...] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts from the DAG ``weights`` (A[i, j] ≠ 0: i → j, its sign activation or repression).

    ``k_range``: range of the Hill interactions' |K| (the regulation strength; default SERGIO child's [1, 5]);
    ``noise``: SERGIO's technical-noise parameters (outlier probability, mean, scale; library-size mean, scale;
    dropout shape, percentile; default the child's, SERGIO's demo values).

    Returns the counts (cells × simulated genes), each cell's type, and the indices of the simulated genes into
    ``weights`` (a gene without any edge is not part of SERGIO's network).
    """
    options = {"n_types": n_types, "cells_per_type": cells_per_type, "seed": seed, **_model(k_range, noise)}
    out = _run_child(weights, options, timeout)
    return np.asarray(out["counts"], dtype=np.float64), out["cell_type"], out["genes"]


def _model(k_range: tuple[float, float] | None, noise: tuple[float, ...] | None) -> dict[str, np.ndarray]:
    """The child's optional ``k_range`` and ``noise`` inputs (absent: the child's defaults)."""
    return {k: np.asarray(v, dtype=float) for k, v in (("k_range", k_range), ("noise", noise)) if v is not None}


def simulate_sergio_knockouts(weights: np.ndarray, knockouts: Sequence[Sequence[int]], *, n_types: int = 5,
                              cells_per_type: int = 400, knockout_cells_per_type: int = 10, seed: int = 0,
                              timeout: float = 1800.0, k_range: tuple[float, float] | None = None,
                              noise: tuple[float, ...] | None = None
                              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Control cells and knock-out cells from the DAG ``weights`` in one SERGIO simulation.

    Each knock-out (a list of gene indices into ``weights``, each gene in SERGIO's network) holds its genes at 0 in
    a copy of every cell type, with the wild-type network's other parameters (``_sergio_child``'s docstring says
    how, as SERGIO 1.9.3 has no perturbation API). ``k_range`` and ``noise`` as for :func:`simulate_sergio`.

    Returns
    -------
    The counts (cells × simulated genes), each cell's type, each cell's knock-out (its index into ``knockouts``;
    −1 for a control cell) and the indices of the simulated genes into ``weights``.
    """
    sources, targets = np.nonzero(weights)
    in_network = set(sources.tolist()) | set(targets.tolist())
    rows = [[int(g) for g in ko] for ko in knockouts]
    if not rows or any(not ko or set(ko) - in_network for ko in rows):
        raise CapeInputError("every knock-out needs at least one gene, each with an edge in the network")
    padded = np.full((len(rows), max(map(len, rows))), -1, dtype=np.int64)
    for k, ko in enumerate(rows):
        padded[k, :len(ko)] = ko
    out = _run_child(weights, {"n_types": n_types, "cells_per_type": cells_per_type, "seed": seed,
                               "knockouts": padded, "knockout_cells_per_type": knockout_cells_per_type,
                               **_model(k_range, noise)}, timeout)
    return np.asarray(out["counts"], dtype=np.float64), out["cell_type"], out["condition"], out["genes"]


def _run_child(weights: np.ndarray, options: dict, timeout: float) -> dict[str, np.ndarray]:
    """Run ``_sergio_child.py`` on the DAG's edges and ``options``; its output arrays."""
    python = sergio_python()
    if python is None:
        raise CapeInputError(f"SERGIO is not installed: run `make sergio-env` or set {SERGIO_PYTHON_ENV} to the python "
                             "of an environment with sergio-scsim==1.9.3")
    sources, targets = np.nonzero(weights)
    with tempfile.TemporaryDirectory(prefix="cape-sergio-") as tmp:
        src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(src, sources=sources, targets=targets, signs=np.sign(weights[sources, targets]), **options)
        # SERGIO iterates over sets of gene-name strings: without a fixed hash seed the same seed gives other counts.
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "MPLBACKEND": "Agg",
               "PYTHONHASHSEED": "0"}
        proc = subprocess.run([python, str(_CHILD), str(src), str(dst)], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=tmp, check=False)
        if proc.returncode != 0 or not dst.exists():
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            raise CapeInputError(f"SERGIO failed: {lines[-1] if lines else f'exit {proc.returncode}'}")
        with np.load(dst) as out:
            return {k: out[k] for k in out.files}
