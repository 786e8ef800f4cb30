"""The order in which a training epoch visits its cells: a seeded shuffle, optionally grouped by token count.

Batches are padded to their longest cell. With cells that express very different numbers of genes, a random batch
spends a large share of its attention and feed-forward work on padding; :class:`LengthGroupedShuffle` cuts each
epoch's shuffled cells into pools of a few batches and sorts every pool by token count before cutting it into
batches (the ``group_by_length`` of Hugging Face's trainer), so a batch holds cells of similar length while every
cell is still visited once per epoch in a seeded, epoch-dependent order.

Both samplers draw the permutation ``DistributedSampler(shuffle=True, seed=seed)`` draws. Under DDP every process
computes the same global order and takes every ``num_replicas``-th cell of each global batch of ``batch_size ·
num_replicas`` cells, so one step over all processes sees the cells one process would see in a batch of that size.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

from ..._errors import CapeInputError


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of ``n`` cells that ``DistributedSampler(shuffle=True, seed=seed)`` draws at ``epoch``."""
    g = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).numpy()


def check_length_grouping(pool_batches: int | None) -> None:
    """Refuse a ``length_grouping`` that is neither None nor a whole number >= 1."""
    if pool_batches is None:
        return
    if isinstance(pool_batches, bool) or not isinstance(pool_batches, int | np.integer) or pool_batches < 1:
        raise CapeInputError(f"length_grouping must be a whole number >= 1 (or None: a plain shuffle), "
                             f"got {pool_batches!r}")


class SeededShuffle(torch.utils.data.Sampler):
    """Single-process twin of ``DistributedSampler(shuffle=True, seed=seed)``: the same permutation per epoch."""

    def __init__(self, n: int, seed: int, shuffle: bool = True) -> None:
        self.n, self.seed, self.shuffle, self.epoch = n, seed, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if not self.shuffle:
            return iter(range(self.n))
        return iter(epoch_permutation(self.n, self.seed, self.epoch).tolist())

    def __len__(self) -> int:
        return self.n


class LengthGroupedShuffle(torch.utils.data.Sampler):
    """Seeded shuffle whose batches hold cells of similar token counts.

    Per epoch: the permutation of :class:`SeededShuffle` (padded, as ``DistributedSampler`` pads, to a multiple of
    ``num_replicas``), cut into pools of ``pool_batches`` global batches of ``batch_size · num_replicas`` cells;
    each pool sorted by ``lengths`` (longest first, ties in shuffled order) and cut into global batches; the full
    global batches shuffled with the same generator, a short one kept last. This process yields its share of each
    global batch (every ``num_replicas``-th cell from ``rank``), so a DataLoader with ``batch_size`` cuts them back
    into its batches.

    Parameters
    ----------
    lengths
        Tokens of each cell of the dataset (what it pads to).
    batch_size
        Cells per batch of one process (the DataLoader's ``batch_size``).
    seed
        Seed of the order; :meth:`set_epoch` draws the epoch's order.
    pool_batches
        Global batches per sorted pool: 1 sorts nothing away from a plain shuffle's batches (only their order
        within each batch changes); larger pools give less padding and batches that differ more from a random draw.
    num_replicas, rank
        DDP world size and this process's rank.
    """

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int, *, pool_batches: int = 16,
                 num_replicas: int = 1, rank: int = 0) -> None:
        check_length_grouping(pool_batches)
        if batch_size < 1 or num_replicas < 1 or not 0 <= rank < num_replicas:
            raise CapeInputError(f"need batch_size >= 1 and 0 <= rank < num_replicas, got {batch_size}, {rank}, "
                                 f"{num_replicas}")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.batch_size, self.seed, self.pool_batches = int(batch_size), int(seed), int(pool_batches)
        self.num_replicas, self.rank, self.epoch = int(num_replicas), int(rank), 0
        self.num_samples = math.ceil(self.lengths.size / self.num_replicas)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def global_batches(self) -> list[np.ndarray]:
        """The epoch's global batches (cells of all processes), in the order they are trained on."""
        n = self.lengths.size
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=g).numpy()
        total = self.num_samples * self.num_replicas
        if total > n:  # DistributedSampler's padding: repeat the head so every process gets as many cells
            order = np.concatenate([order, np.resize(order, total - n)])
        width = self.batch_size * self.num_replicas
        pool = width * self.pool_batches
        batches = []
        for start in range(0, total, pool):
            chunk = order[start:start + pool]
            chunk = chunk[np.argsort(-self.lengths[chunk], kind="stable")]
            batches.extend(chunk[i:i + width] for i in range(0, chunk.size, width))
        # A short last batch stays last: in the middle it would shift every later batch of the DataLoader.
        full = len(batches) - (batches[-1].size < width)
        shuffled = torch.randperm(full, generator=g).tolist()
        return [batches[i] for i in shuffled] + batches[full:]

    def __iter__(self) -> Iterator[int]:
        return iter(int(i) for batch in self.global_batches() for i in batch[self.rank::self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
