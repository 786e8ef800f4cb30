"""Child process for the GRNBoost2 peer: ``PYTHON _grnboost2_child.py grnboost2 IN.npz OUT.npz``.

Runs in the interpreter of an environment with ``arboreto`` installed (it needs dask < 2024.2 and NumPy < 2,
which clash with cape's own environment), so it imports neither cape nor anything cape needs: only NumPy, pandas,
arboreto and distributed. Every gene is a candidate regulator of every other. Writes ``W`` (W[i, j]: GRNBoost2's
importance of gene i for gene j, 0 where it reported none) and ``seconds`` (the fit's wall time).
"""

from __future__ import annotations

import os
import sys
import time


def importance_matrix(links, n_genes: int):
    """Genes × genes importances from arboreto's ``TF``, ``target``, ``importance`` frame (genes named 0 … M−1)."""
    import numpy as np

    W = np.zeros((n_genes, n_genes))
    W[links["TF"].astype(int).to_numpy(), links["target"].astype(int).to_numpy()] = links["importance"].to_numpy()
    np.fill_diagonal(W, 0.0)
    return W


def fit(X, seed: int):
    import pandas as pd
    from arboreto.algo import grnboost2
    from distributed import Client, LocalCluster

    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    frame = pd.DataFrame(X, columns=[str(i) for i in range(X.shape[1])])
    # One in-process worker: the parent's budget and thread count hold, and no scheduler outlives the fit.
    with LocalCluster(n_workers=1, threads_per_worker=threads, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        links = grnboost2(expression_data=frame, client_or_address=client, seed=seed, verbose=False)
    return importance_matrix(links, X.shape[1])


def main(argv: list[str]) -> int:
    import numpy as np

    method, src, dst = argv
    if method != "grnboost2":
        raise ValueError(f"unknown method {method!r}")
    data = np.load(src)
    start = time.perf_counter()
    W = fit(np.asarray(data["X"], dtype=np.float64), int(data["seed"]))
    np.savez(dst, W=W, seconds=time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
