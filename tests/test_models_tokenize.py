"""Tokenisation: binning, vocabulary, gene sampling, masking and padding (cape.models.tokenize)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from cape import CapeInputError
from cape.models.tokenize import (
    CLS_TOKEN,
    MASK_VALUE,
    PAD_TOKEN,
    PAD_VALUE,
    CellCollator,
    CellDataset,
    GeneVocab,
    TokenizerConfig,
    _item_rng,
    _item_states,
    collate_cells,
    log2_bin,
    quantile_bin,
    quantile_bin_segments,
)

expression = arrays(np.float64, st.integers(1, 60),
                    elements=st.one_of(st.just(0.0), st.floats(0.01, 20.0, allow_nan=False)))


@settings(max_examples=60, deadline=None)
@given(expression, st.integers(2, 60))
def test_quantile_bins_are_monotone_and_in_range(values, n_bins):
    bins = quantile_bin(values, n_bins)
    assert bins.dtype == np.int64
    assert np.all((bins == 0) == (values == 0))          # zeros and only zeros get bin 0
    assert bins.min(initial=1) >= 0 and bins.max(initial=0) <= n_bins - 1
    order = np.argsort(values, kind="stable")
    assert np.all(np.diff(bins[order]) >= 0)              # non-decreasing in the value within a cell
    nz = values > 0
    if nz.any():
        assert bins[nz].max() == n_bins - 1 or np.unique(values[nz]).size == 1 or n_bins == 2
        assert bins[np.argmax(values)] == n_bins - 1      # the cell's largest value gets the top bin


def test_quantile_bins_are_per_cell_scale_invariant():
    rng = np.random.default_rng(0)
    v = rng.exponential(size=200) * (rng.random(200) > 0.3)
    assert np.array_equal(quantile_bin(v, 51), quantile_bin(7.5 * v, 51))
    # 51 bins over distinct values: levels 1..49 hold equal shares (the edges are quantiles); as in scGPT,
    # the top level 50 (the last edge is the maximum) holds only the cell's largest value.
    counts = np.bincount(quantile_bin(rng.exponential(size=4900), 51), minlength=51)
    assert counts[0] == 0 and counts[50] == 1
    assert counts[1:50].min() >= 99 and counts[1:50].max() <= 101


def test_log2_bins_match_scbert_truncation():
    v = np.array([0.0, 0.4, 1.0, 1.99, 2.0, 4.7, 5.0, 9.3])
    assert log2_bin(v, 5).tolist() == [0, 0, 1, 1, 2, 4, 5, 5]
    with pytest.raises(CapeInputError, match="non-negative"):
        log2_bin(np.array([-1.0]), 5)
    with pytest.raises(CapeInputError, match="non-negative"):
        quantile_bin(np.array([1.0, -0.5]), 51)


def test_vocab_specials_roundtrip_and_difference(tmp_path):
    vocab = GeneVocab.from_genes(["A", "B", "C"])
    assert vocab.tokens[:2] == [PAD_TOKEN, CLS_TOKEN] and vocab.pad_id == 0 and vocab.cls_id == 1
    assert vocab.lookup(["C", "Z"]).tolist() == [4, -1]
    vocab.to_json(tmp_path / "vocab.json")
    assert GeneVocab.from_json(tmp_path / "vocab.json") == vocab
    assert vocab.difference(["A", "B", "X", "Y"]) == (2, 1)
    # scGPT-style vocab: specials after the genes
    other = GeneVocab.from_mapping({"G1": 0, "G2": 1, "<pad>": 2, "<cls>": 3, "<eoc>": 4})
    assert other.pad_id == 2 and other.cls_id == 3 and other.genes == ["G1", "G2", "<eoc>"]
    with pytest.raises(CapeInputError, match="duplicate"):
        GeneVocab(["<pad>", "<cls>", "A", "A"])
    with pytest.raises(CapeInputError, match="<cls>"):
        GeneVocab(["<pad>", "A"])
    with pytest.raises(CapeInputError, match="clashes"):
        GeneVocab.from_genes(["A", "<pad>"])


def _dataset(max_len=8, include_zero=False, mask_ratio=0.0, seed=0, binning="quantile", n_bins=51):
    rng = np.random.default_rng(1)
    X = rng.poisson(0.7, size=(12, 20)).astype(np.float32)
    X[3] = 0.0                                               # an empty cell
    gene_ids = np.arange(20) + 2
    gene_ids[5] = -1                                         # a gene outside the vocabulary
    vocab = GeneVocab.from_genes([f"g{i}" for i in range(20)])
    cfg = TokenizerConfig(binning=binning, n_bins=n_bins, max_len=max_len, include_zero_genes=include_zero)
    return CellDataset(sp.csr_matrix(np.log1p(X)), gene_ids, vocab, cfg, mask_ratio=mask_ratio, seed=seed), X


def test_cells_start_with_cls_and_respect_max_len():
    data, X = _dataset(max_len=6)
    for i in range(len(data)):
        item = data[i]
        assert item["gene_ids"][0] == data.vocab.cls_id and item["values"][0] == 0
        assert item["gene_ids"].size <= 6
        assert 7 not in item["gene_ids"]                     # the out-of-vocabulary column (g5, id 7) is dropped
        expressed = set(np.flatnonzero(X[i] > 0) + 2) - {7}
        assert set(item["gene_ids"][1:]) <= expressed        # only expressed genes by default
        assert len(item["gene_ids"]) - 1 == min(5, len(expressed))
        assert np.all(item["values"][1:] >= 1)               # expressed genes have a non-zero bin
    assert data[3]["gene_ids"].tolist() == [data.vocab.cls_id]


def test_include_zero_genes_and_sampling_is_seeded():
    data, _ = _dataset(max_len=100, include_zero=True)
    assert data[0]["gene_ids"].size == 1 + 19
    a, _ = _dataset(max_len=4, seed=3)
    b, _ = _dataset(max_len=4, seed=3)
    c, _ = _dataset(max_len=4, seed=4)
    same = [np.array_equal(a[i]["gene_ids"], b[i]["gene_ids"]) for i in range(12)]
    diff = [np.array_equal(a[i]["gene_ids"], c[i]["gene_ids"]) for i in range(12)]
    assert all(same) and not all(diff)
    a.set_epoch(1)
    assert not all(np.array_equal(a[i]["gene_ids"], b[i]["gene_ids"]) for i in range(12))


@pytest.mark.parametrize(("binning", "n_bins", "include_zero"),
                         [("quantile", 51, False), ("quantile", 51, True), ("log2", 5, False), ("log2", 5, True)])
def test_cached_bins_give_the_tokens_of_fresh_binning(binning, n_bins, include_zero, monkeypatch):
    data, X = _dataset(max_len=6, mask_ratio=0.3, binning=binning, n_bins=n_bins, include_zero=include_zero)
    data.cell_targets = True
    keep = np.delete(np.arange(20), 5)
    binning_fn = quantile_bin if binning == "quantile" else log2_bin
    for epoch in (0, 1, 2):                                  # epoch 0 fills the cache, the others read it
        data.set_epoch(epoch)
        for i in range(len(data)):
            item = data[i]
            bins = binning_fn(np.log1p(X[i])[keep], n_bins)
            assert item["cell_values"].tolist() == bins.tolist()
            assert item["values"][1:].tolist() == bins[item["gene_ids"][1:] - 2 - (item["gene_ids"][1:] > 7)].tolist()
    assert len(data._bins) == len(data)
    monkeypatch.setattr("cape.models.tokenize.BIN_CACHE_MAX_ENTRIES", 0)   # full cache: bin afresh, same tokens
    full, _ = _dataset(max_len=6, mask_ratio=0.3, binning=binning, n_bins=n_bins, include_zero=include_zero)
    full.set_epoch(2)
    assert all(np.array_equal(full[i]["values"], data[i]["values"]) for i in range(len(data)))
    assert sum(expressed.size for expressed, _ in full._bins.values()) == 0   # only the empty cell fits


def test_masking_and_collation():
    data, _ = _dataset(max_len=10, mask_ratio=0.3)
    items = [data[i] for i in range(6)]
    for item in items:
        assert not item["mask"][0]                           # <cls> is never masked
        assert item["mask"].sum() == round(0.3 * (item["gene_ids"].size - 1))
    batch = collate_cells(items, pad_id=data.vocab.pad_id)
    L = max(it["gene_ids"].size for it in items)
    assert batch["gene_ids"].shape == (6, L)
    for b, item in enumerate(items):
        m = item["gene_ids"].size
        assert not batch["padding_mask"][b, :m].any() and batch["padding_mask"][b, m:].all()
        assert (batch["gene_ids"][b, m:] == data.vocab.pad_id).all()
        assert (batch["values"][b, m:] == PAD_VALUE).all()
        assert not batch["mask"][b, m:].any()
    masked = batch["masked_values"]
    assert (masked[batch["mask"]] == MASK_VALUE).all()
    assert (masked[~batch["mask"]] == batch["values"][~batch["mask"]]).all()


def test_log2_dataset_tokens():
    data, X = _dataset(binning="log2", n_bins=5, max_len=100, include_zero=True)
    item = data[0]
    expected = np.minimum(np.floor(np.log1p(X[0])), 5)
    keep = np.delete(np.arange(20), 5)
    assert item["values"][1:].tolist() == expected[keep].tolist()


def test_bad_tokenizer_config():
    with pytest.raises(CapeInputError, match="binning"):
        TokenizerConfig(binning="rank")
    with pytest.raises(CapeInputError, match="max_len"):
        TokenizerConfig(max_len=1)


# ------------------------------------------------------------------------------------- the batch path (DataLoader)
def _assert_same_batch(fast: dict, slow: dict) -> None:
    assert fast.keys() == slow.keys()
    for key in slow:
        assert fast[key].dtype == slow[key].dtype, key
        assert torch.equal(fast[key], slow[key]), key


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["quantile", "log2"]), st.booleans(), st.booleans(),
       st.sampled_from([0.0, 0.15, 0.5]), st.integers(2, 40), st.integers(0, 3))
def test_batch_path_matches_the_per_cell_path(seed, binning, sparse, zeros, mask_ratio, max_len, epoch):
    rng = np.random.default_rng(seed)
    n_cells, n_genes = int(rng.integers(1, 12)), int(rng.integers(1, 30))
    X = rng.lognormal(0.0, 1.0, (n_cells, n_genes)) * (rng.random((n_cells, n_genes)) < rng.uniform(0.05, 0.9))
    X[rng.random(X.shape) < 0.2] = np.round(X[rng.random(X.shape) < 0.2].mean() if X.any() else 1.0, 1)  # ties
    if rng.random() < 0.3:
        X = np.floor(X * 3) / 3                                           # many ties, some become zero
    ids = rng.permutation(n_genes) + 2
    ids[rng.random(n_genes) < 0.2] = -1                                  # columns outside the vocabulary
    if not (ids >= 0).any():
        ids[0] = 2
    vocab = GeneVocab.from_genes([f"g{j}" for j in range(n_genes)])
    matrix = sp.csr_matrix(X) if sparse else X
    config = TokenizerConfig(binning=binning, n_bins=51 if binning == "quantile" else 5, max_len=max_len,
                             include_zero_genes=zeros)
    labels = rng.integers(0, 3, n_cells)
    fast_set = CellDataset(matrix, ids, vocab, config, labels=labels, mask_ratio=mask_ratio, seed=seed,
                           cell_targets=True)
    slow_set = CellDataset(matrix, ids, vocab, config, labels=labels, mask_ratio=mask_ratio, seed=seed,
                           cell_targets=True)
    fast_set.set_epoch(epoch)
    slow_set.set_epoch(epoch)
    order = rng.permutation(n_cells)[: int(rng.integers(1, n_cells + 1))].tolist()
    for _ in range(2):                                                    # binned afresh, then from the cache
        _assert_same_batch(collate_cells(fast_set.__getitems__(order), pad_id=vocab.pad_id),
                           collate_cells([slow_set[i] for i in order], pad_id=vocab.pad_id))


def test_batch_path_sums_duplicate_csr_entries_and_leaves_the_matrix_alone():
    X = sp.csr_matrix((np.array([1.0, 2.0, 0.5, 4.0]), np.array([1, 1, 0, 2]), np.array([0, 3, 4])), shape=(2, 3))
    assert not X.has_canonical_format
    data = CellDataset(X, np.array([2, 3, 4]), GeneVocab.from_genes(["a", "b", "c"]),
                       TokenizerConfig(binning="log2", max_len=4))
    fast = collate_cells(data.__getitems__([0, 1]), pad_id=0)
    _assert_same_batch(fast, collate_cells([data[0], data[1]], pad_id=0))
    assert fast["values"][0, 1:].tolist() == [0.0, 3.0]                 # log2 bins of 0.5 and of 1 + 2
    assert X.data.tolist() == [1.0, 2.0, 0.5, 4.0]


@pytest.mark.parametrize("binning", ["quantile", "log2"])
def test_batch_path_refuses_negative_expression(binning):
    data = CellDataset(np.array([[1.0, -0.5]]), np.array([2, 3]), GeneVocab.from_genes(["a", "b"]),
                       TokenizerConfig(binning=binning, max_len=4))
    with pytest.raises(CapeInputError, match=f"{binning} binning needs non-negative"):
        data.__getitems__([0])


def test_dataloader_fetches_whole_batches_through_a_subset():
    rng = np.random.default_rng(3)
    X = sp.random(40, 25, density=0.3, random_state=3, format="csr")
    vocab = GeneVocab.from_genes([f"g{j}" for j in range(25)])
    data = CellDataset(X, np.arange(25) + 2, vocab, TokenizerConfig(max_len=6), mask_ratio=0.3, seed=5)
    subset = torch.utils.data.Subset(data, rng.permutation(40)[:30])
    loader = torch.utils.data.DataLoader(subset, batch_size=8, collate_fn=CellCollator(vocab.pad_id))
    seen = 0
    for start, batch in zip(range(0, 30, 8), loader, strict=True):
        cells = [subset[k] for k in range(start, min(start + 8, 30))]
        _assert_same_batch(batch, collate_cells(cells, pad_id=vocab.pad_id))
        seen += batch["gene_ids"].shape[0]
    assert seen == 30


@settings(max_examples=60, deadline=None)
@given(st.lists(arrays(np.float64, st.integers(0, 40), elements=st.one_of(
    st.sampled_from([0.5, 1.0, 2.0]), st.floats(1e-3, 50.0, allow_nan=False))), min_size=1, max_size=6),
    st.integers(2, 60))
def test_quantile_bin_segments_is_quantile_bin_cell_by_cell(cells, n_bins):
    counts = np.array([c.size for c in cells])
    got = quantile_bin_segments(np.concatenate(cells), counts, n_bins)
    assert np.array_equal(got, np.concatenate([quantile_bin(c, n_bins) for c in cells]))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1),
       st.lists(st.integers(0, 2**32 - 1), min_size=0, max_size=5))
def test_item_states_are_the_per_cell_generators(seed, epoch, indices):
    states = _item_states(seed, epoch, np.array(indices, dtype=np.int64))
    expected = [_item_rng(seed, epoch, i).bit_generator.state["state"] for i in indices]
    assert states == [(s["state"], s["inc"]) for s in expected]


def test_item_states_decline_indices_beyond_one_word():
    assert _item_states(0, 0, np.array([2**32])) is None
    assert _item_states(0, 2**32, np.array([1])) is None


def test_padding_to_a_multiple_adds_only_masked_padding() -> None:
    from cape.models.tokenize import PAD_VALUE, pad_to_multiple

    batch = {"gene_ids": torch.tensor([[5, 6, 7], [8, 0, 0]]), "values": torch.tensor([[1.0, 2, 3], [4, -2, -2]]),
             "masked_values": torch.tensor([[1.0, -1, 3], [4, -2, -2]]),
             "mask": torch.tensor([[0, 1, 0], [0, 0, 0]]).bool(),
             "padding_mask": torch.tensor([[0, 0, 0], [0, 1, 1]]).bool(), "label": torch.tensor([1, 2])}
    out = pad_to_multiple(batch, 4, pad_id=0)
    assert out["gene_ids"].shape == (2, 4) and torch.equal(out["label"], batch["label"])
    for key in ("gene_ids", "values", "masked_values", "mask", "padding_mask"):
        assert torch.equal(out[key][:, :3], batch[key])
    assert out["padding_mask"][:, 3].all() and not out["mask"][:, 3].any()
    assert (out["gene_ids"][:, 3] == 0).all() and (out["values"][:, 3] == PAD_VALUE).all()
    assert pad_to_multiple(batch, 3, pad_id=0) is batch and pad_to_multiple(batch, 1, pad_id=0) is batch
