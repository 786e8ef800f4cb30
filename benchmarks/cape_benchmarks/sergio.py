"""SERGIO counts from a known DAG, simulated in SERGIO's own environment (``make sergio-env``).

SERGIO is GPL-3 licensed and cape is MIT, so the simulator runs as a separate program (``_sergio_child.py``) in
an interpreter of its own, found as the other own-environment tools are: ``$CAPE_SERGIO_PYTHON``, else
``./.venv-sergio/bin/python``, else this interpreter if it can import ``SERGIO``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from cape._errors import CapeInputError

from .peers import own_environment_python

__all__ = ["SERGIO_PYTHON_ENV", "sergio_python", "simulate_sergio"]

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
    python = sergio_python()
    if python is None:
        raise CapeInputError(f"SERGIO is not installed: run `make sergio-env` or set {SERGIO_PYTHON_ENV} to the python "
                             "of an environment with sergio-scsim==1.9.3")
    sources, targets = np.nonzero(weights)
    options = {k: np.asarray(v, dtype=float) for k, v in (("k_range", k_range), ("noise", noise)) if v is not None}
    with tempfile.TemporaryDirectory(prefix="cape-sergio-") as tmp:
        src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(src, sources=sources, targets=targets, signs=np.sign(weights[sources, targets]), n_types=n_types,
                 cells_per_type=cells_per_type, seed=seed, **options)
        # SERGIO iterates over sets of gene-name strings: without a fixed hash seed the same seed gives other counts.
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "MPLBACKEND": "Agg",
               "PYTHONHASHSEED": "0"}
        proc = subprocess.run([python, str(_CHILD), str(src), str(dst)], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=tmp, check=False)
        if proc.returncode != 0 or not dst.exists():
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            raise CapeInputError(f"SERGIO failed: {lines[-1] if lines else f'exit {proc.returncode}'}")
        out = np.load(dst)
        return np.asarray(out["counts"], dtype=np.float64), out["cell_type"], out["genes"]


