"""``python -m cape_benchmarks.loader`` machinery on a tiny shape (no timing assertions)."""

from __future__ import annotations

import numpy as np
import torch

from cape.models.tokenize import CellCollator, CellDataset, GeneVocab, TokenizerConfig
from cape_benchmarks import loader


def test_random_cells_have_the_asked_number_of_expressed_genes():
    X = loader.random_cells(7, n_genes=50, expressed=12, seed=1)
    assert X.shape == (7, 50)
    assert np.diff(X.indptr).tolist() == [12] * 7
    assert (X.data > 0).all() and X.has_canonical_format


def test_per_cell_path_makes_dataloaders_fetch_cell_by_cell_with_the_same_batches(monkeypatch):
    X = loader.random_cells(10, n_genes=30, expressed=9, seed=2)
    vocab = GeneVocab.from_genes([f"g{j}" for j in range(30)])
    data = CellDataset(X, np.arange(30) + 2, vocab, TokenizerConfig(max_len=6), mask_ratio=0.3, seed=4)
    fetched: list[int] = []
    per_cell = CellDataset.__getitem__

    def counting(self, i):
        fetched.append(int(i))
        return per_cell(self, i)

    monkeypatch.setattr(CellDataset, "__getitem__", counting)
    subset = torch.utils.data.Subset(data, list(range(1, 9)))
    make = lambda: torch.utils.data.DataLoader(subset, batch_size=4, collate_fn=CellCollator(vocab.pad_id))  # noqa: E731
    batched = list(make())
    assert fetched == []                                        # whole batches: __getitems__
    with loader.per_cell_path():
        old = list(make())
    assert fetched == list(range(1, 9))
    assert callable(CellDataset.__getitems__)                   # restored on leaving
    for a, b in zip(batched, old, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in b)


def test_loader_benchmark_runs_and_prints_both_paths(capsys):
    loader.main(["--cells", "40", "--repeats", "1", "--batch-size", "16"])
    out = capsys.readouterr().out
    assert out.count(" cells/s, batch ") == 4                  # pretraining and fine-tuning, first and later epochs
