"""The training order (cape.models.training.sampling): every cell once per epoch, seeded, the DDP shares of each
global batch, and less padding than a plain shuffle when cells differ in length."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _models_data import cape_adata, one_thread  # noqa: F401  (fixture)
from hypothesis import given, settings
from hypothesis import strategies as st

from cape._errors import CapeInputError
from cape.models import CellTransformer
from cape.models.training.engine import token_lengths, train_sampler
from cape.models.training.sampling import LengthGroupedShuffle, SeededShuffle, epoch_permutation


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), batch=st.integers(1, 40), pool=st.integers(1, 8), world=st.integers(1, 4),
       seed=st.integers(0, 10_000), epoch=st.integers(0, 5))
def test_every_cell_once_per_epoch_and_ranks_share_each_global_batch(n, batch, pool, world, seed, epoch):
    lengths = np.random.default_rng(seed).integers(2, 200, n)
    samplers = [LengthGroupedShuffle(lengths, batch, seed, pool_batches=pool, num_replicas=world, rank=r)
                for r in range(world)]
    for s in samplers:
        s.set_epoch(epoch)
    streams = [list(s) for s in samplers]
    per_rank = -(-n // world)
    assert all(len(stream) == per_rank == len(s) for stream, s in zip(streams, samplers, strict=True))
    # Every cell at least once, and no cell more often than DistributedSampler's padding repeats it.
    counts = np.bincount(np.concatenate(streams), minlength=n)
    assert counts.min() >= 1 and counts.sum() == per_rank * world
    # Step k of all processes together is one global batch of the single-process order (batch · world cells).
    single = LengthGroupedShuffle(lengths, batch * world, seed, pool_batches=pool)
    single.set_epoch(epoch)
    globals_ = single.global_batches() if world == 1 else samplers[0].global_batches()
    for k, cells in enumerate(globals_):
        step = np.concatenate([stream[k * batch:(k + 1) * batch] for stream in streams])
        assert sorted(step.tolist()) == sorted(cells.tolist())


def test_single_process_order_is_the_distributed_samplers_permutation_regrouped():
    lengths = np.arange(100) % 7 + 1
    grouped = LengthGroupedShuffle(lengths, 10, seed=3, pool_batches=2)
    grouped.set_epoch(4)
    plain = SeededShuffle(100, seed=3)
    plain.set_epoch(4)
    distributed = torch.utils.data.DistributedSampler(range(100), num_replicas=1, rank=0, shuffle=True, seed=3)
    distributed.set_epoch(4)
    assert list(plain) == list(distributed) == epoch_permutation(100, 3, 4).tolist()
    perm = epoch_permutation(100, 3, 4)
    # Each pool of 2 batches holds the cells of 20 consecutive places of the permutation, sorted by length.
    batches = grouped.global_batches()
    pools = {tuple(sorted(perm[s:s + 20].tolist())) for s in range(0, 100, 20)}
    for batch in batches:
        assert any(set(batch.tolist()) <= set(p) for p in pools)
        assert np.all(np.diff(lengths[batch]) <= 0)
    assert list(grouped) == [int(i) for b in batches for i in b]


def test_order_is_seeded_and_changes_with_the_epoch():
    lengths = np.random.default_rng(0).integers(5, 150, 500)
    a, b = (LengthGroupedShuffle(lengths, 32, seed=7) for _ in range(2))
    assert list(a) == list(b)
    b.set_epoch(1)
    assert list(a) != list(b)
    assert list(a) != list(LengthGroupedShuffle(lengths, 32, seed=8))


def test_short_last_batch_stays_last():
    lengths = np.random.default_rng(1).integers(5, 150, 105)
    for epoch in range(5):
        s = LengthGroupedShuffle(lengths, 10, seed=0, pool_batches=3)
        s.set_epoch(epoch)
        sizes = [b.size for b in s.global_batches()]
        assert sizes == [10] * 10 + [5]


def test_grouped_batches_pad_less_than_plain_batches():
    lengths = np.random.default_rng(2).integers(50, 160, 3000)
    plain = np.array(list(SeededShuffle(3000, 0)))
    grouped = np.array(list(LengthGroupedShuffle(lengths, 32, 0)))

    def padded(order: np.ndarray) -> int:
        return sum(int(lengths[order[i:i + 32]].max()) * len(order[i:i + 32]) for i in range(0, 3000, 32))

    assert padded(grouped) < 0.8 * padded(plain)
    assert padded(grouped) >= lengths.sum()


def test_pool_of_one_batch_keeps_a_plain_shuffles_batches():
    lengths = np.random.default_rng(3).integers(5, 150, 64)
    grouped = LengthGroupedShuffle(lengths, 8, seed=2, pool_batches=1)
    perm = epoch_permutation(64, 2, 0)
    plain_batches = {tuple(sorted(perm[i:i + 8].tolist())) for i in range(0, 64, 8)}
    assert {tuple(sorted(b.tolist())) for b in grouped.global_batches()} == plain_batches


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "16"])
def test_length_grouping_is_checked(bad):
    with pytest.raises(CapeInputError, match="length_grouping must be a whole number"):
        LengthGroupedShuffle(np.ones(4, dtype=int), 2, 0, pool_batches=bad)


@pytest.mark.usefixtures("one_thread")
def test_the_trainer_groups_cells_by_their_padded_token_counts():
    adata = cape_adata(n_cells=40)
    model = CellTransformer(adata, "scgpt", "cape", d_model=16, n_heads=2, n_layers=1, seed=0, max_len=14)
    dataset = model._dataset(adata)
    tokens = np.diff(adata[:, adata.var["cape_used"].to_numpy()].X.tocsr().indptr)
    expected = np.minimum(tokens, 13) + 1                    # gene tokens within max_len, plus <cls>
    assert expected.min() < expected.max()
    np.testing.assert_array_equal(token_lengths(dataset), expected)
    picked = [int(np.argmin(expected)), int(np.argmax(expected)), 3]
    subset = torch.utils.data.Subset(dataset, picked)
    np.testing.assert_array_equal(token_lengths(subset), expected[picked])
    assert isinstance(train_sampler(subset, 8, 0, 16), LengthGroupedShuffle)
    assert isinstance(train_sampler(subset, 8, 0, None), SeededShuffle)
    # Cells of one length (every gene a token): nothing to group.
    zeros = CellTransformer(adata, "scgpt", "cape", d_model=16, n_heads=2, n_layers=1, seed=0,
                            include_zero_genes=True)
    assert token_lengths(zeros._dataset(adata)) is None
    assert isinstance(train_sampler(zeros._dataset(adata), 8, 0, 16), SeededShuffle)


@pytest.mark.usefixtures("one_thread")
def test_pretraining_refuses_a_bad_length_grouping():
    adata = cape_adata(n_cells=20)
    model = CellTransformer(adata, "scgpt", "cape", d_model=16, n_heads=2, n_layers=1, seed=0)
    with pytest.raises(CapeInputError, match="length_grouping"):
        model.pretrain(adata, epochs=1, length_grouping=0)
