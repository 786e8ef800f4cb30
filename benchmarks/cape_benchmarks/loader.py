"""Input-pipeline throughput: cells/s of tokenising, binning, masking and collating alone (no model), the batch
path (:meth:`~cape.models.tokenize.CellDataset.__getitems__`) against the per-cell path, interleaved in one run.

Run ``python -m cape_benchmarks.loader [--cells 4000] [--repeats 5]``; ``--pbmc`` times one CPU pretraining epoch of
the default model on pbmc68k_reduced with each path instead. Figures go to docs/benchmarks/throughput.md.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import numpy as np
import scipy.sparse as sp

from cape.models.tokenize import CellCollator, CellDataset, GeneVocab, TokenizerConfig, covering_max_len


def random_cells(n_cells: int, n_genes: int = 2000, expressed: int = 711, seed: int = 0) -> sp.csr_matrix:
    """Log-normalised-like sparse cells with ``expressed`` non-zero genes each."""
    rng = np.random.default_rng(seed)
    cols = np.argsort(rng.random((n_cells, n_genes)), axis=1)[:, :expressed]
    cols.sort(axis=1)
    data = np.log1p(rng.lognormal(0.0, 1.0, n_cells * expressed))
    return sp.csr_matrix((data, cols.ravel(), np.arange(n_cells + 1) * expressed), shape=(n_cells, n_genes))


def epoch_seconds(data: CellDataset, batch_size: int, batched: bool, epoch: int) -> float:
    """One pass over ``data`` in a shuffled order, as one DataLoader worker makes it."""
    collate = CellCollator(data.vocab.pad_id)
    order = np.random.default_rng(epoch).permutation(len(data))
    data.set_epoch(epoch)
    start = time.perf_counter()
    for lo in range(0, len(order), batch_size):
        idx = order[lo:lo + batch_size].tolist()
        collate(data.__getitems__(idx) if batched else [data[i] for i in idx])
    return time.perf_counter() - start


@contextlib.contextmanager
def per_cell_path():
    """DataLoaders fetch cell by cell (``__getitem__``) while inside: the path before batch tokenisation."""
    batched = CellDataset.__getitems__
    CellDataset.__getitems__ = None  # torch's fetcher and Subset fall back to __getitem__ when it is not callable
    try:
        yield
    finally:
        CellDataset.__getitems__ = batched


def pbmc_epochs(repeats: int) -> None:
    """Seconds of one CPU pretraining epoch (no validation) of the default model on pbmc68k_reduced, each path."""
    import cape
    from cape.models import CellTransformer

    adata = cape.data.load("pbmc68k_reduced")
    cape.pp.preprocess(adata, n_top_genes=300)
    cape.tl.cape(adata)
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for batched in (False, True):
            model = CellTransformer(adata, architecture="scgpt", encoding="cape", device="cpu", seed=0)
            with contextlib.nullcontext() if batched else per_cell_path():
                history = model.pretrain(adata, epochs=1, validation_fraction=0.0)
            seconds[batched].append(history[-1]["seconds"])
    old, new = np.median(seconds[False]), np.median(seconds[True])
    print(f"pbmc68k_reduced ({adata.n_obs} cells), one pretraining epoch on the CPU (median of {repeats}): "
          f"per cell {old:.2f} s, batch {new:.2f} s, ratio {new / old:.3f}")
    print("  per cell:", " ".join(f"{x:.2f}" for x in seconds[False]), "| batch:",
          " ".join(f"{x:.2f}" for x in seconds[True]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pbmc", action="store_true", help="time pretraining epochs on pbmc68k_reduced instead")
    args = parser.parse_args(argv)
    if args.pbmc:
        pbmc_epochs(args.repeats)
        return
    X = random_cells(args.cells)
    vocab = GeneVocab.from_genes([f"g{j}" for j in range(X.shape[1])])
    ids = np.arange(X.shape[1]) + 2
    config = TokenizerConfig(max_len=covering_max_len(np.diff(X.indptr)))
    print(f"{args.cells} cells x {X.shape[1]} genes, {int(np.diff(X.indptr).max())} expressed per cell, "
          f"max_len {config.max_len}, batch {args.batch_size}; cells/s of one process (median of {args.repeats})")
    for name, kwargs in (("pretraining (mask 0.15, cell targets)", {"mask_ratio": 0.15, "cell_targets": True}),
                         ("fine-tuning (labels)", {"labels": np.zeros(args.cells, dtype=np.int64)})):
        for first in (True, False):
            rates: dict[bool, list[float]] = {False: [], True: []}
            for rep in range(args.repeats):
                for batched in (False, True):                     # interleaved: old, new, old, new...
                    data = CellDataset(X, ids, vocab, config, seed=0, **kwargs)
                    if not first:
                        epoch_seconds(data, args.batch_size, batched, 0)   # bins kept from a first epoch
                    rates[batched].append(args.cells / epoch_seconds(data, args.batch_size, batched, rep + 1))
            old, new = np.median(rates[False]), np.median(rates[True])
            when = "first epoch (binning)" if first else "later epochs (bins kept)"
            print(f"{name}, {when}: per cell {old:,.0f} cells/s, batch {new:,.0f} cells/s, x{new / old:.1f}")


if __name__ == "__main__":
    main()
