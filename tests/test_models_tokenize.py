"""Tokenisation: binning, vocabulary, gene sampling, masking and padding (cape.models.tokenize)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from cape import CapeInputError
from cape.models.tokenize import (
    CLS_TOKEN,
    MASK_VALUE,
    PAD_TOKEN,
    PAD_VALUE,
    CellDataset,
    GeneVocab,
    TokenizerConfig,
    collate_cells,
    log2_bin,
    quantile_bin,
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
