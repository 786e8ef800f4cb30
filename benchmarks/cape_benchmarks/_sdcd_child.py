"""Child process for the SDCD and DCD-FG peers: ``PYTHON _sdcd_child.py METHOD IN.npz OUT.npz``.

Runs in the interpreter of an environment with ``sdcd`` installed (its pins, pandas < 2 and an old wandb,
clash with cape's own environment), so it imports neither cape nor anything cape needs: only NumPy,
pandas, torch and sdcd. Writes ``W`` (the method's weighted adjacency, zero outside its thresholded DAG;
A[i, j] ≠ 0: i → j) and ``seconds`` (the fit's wall time).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

os.environ.setdefault("WANDB_MODE", "disabled")


def fit(method: str, X, seed: int, intervened=None):
    import numpy as np
    import pandas as pd
    import torch
    from sdcd.utils import create_intervention_dataset

    torch.manual_seed(seed)
    frame = pd.DataFrame(X, columns=[str(i) for i in range(X.shape[1])])
    # sdcd's labels: the perturbed columns' names joined by commas; a name that is no column ("obs") is observational.
    frame["perturbation_label"] = "obs" if intervened is None else [
        ",".join(map(str, np.flatnonzero(row))) or "obs" for row in intervened]
    dataset = create_intervention_dataset(frame, perturbation_colname="perturbation_label")
    # sdcd prints progress to stdout; keep the parent's pipe for errors.
    with contextlib.redirect_stdout(sys.stderr):
        if method in ("sdcd", "sdcd_labels"):
            from sdcd.models import SDCD

            model = SDCD()
            model.train(dataset)
        elif method == "dcdfg":
            from sdcd.models import DCDFG

            model = DCDFG()
            model.train(dataset)
        else:
            raise ValueError(f"unknown method {method!r}")
    weights = np.asarray(model.get_adjacency_matrix(threshold=False), dtype=np.float64)
    dag = np.asarray(model.get_adjacency_matrix(threshold=True), dtype=np.float64)
    return np.where(dag != 0, np.maximum(np.abs(weights), 1e-12), 0.0)


def main(argv: list[str]) -> int:
    import numpy as np

    method, src, dst = argv
    data = np.load(src)
    start = time.perf_counter()
    intervened = data["intervened"] if "intervened" in data.files else None
    W = fit(method, np.asarray(data["X"], dtype=np.float32), int(data["seed"]), intervened)
    np.savez(dst, W=W, seconds=time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
