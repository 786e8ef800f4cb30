"""Tokenisation of cells for scGPT- and scBERT-style backbones.

A cell becomes a sequence ``<cls>, g_1, ..., g_n`` of gene tokens (indices into a :class:`GeneVocab`) with one
expression value per token:

* scGPT: per-cell quantile binning into ``n_bins = 51`` levels (0 = not expressed, 1..50 = quantile bin of the
  cell's non-zero values), fed to a continuous value encoder;
* scBERT: log2 bins, ``floor(log2(1 + x))`` clipped to ``n_bins = 5``, used as token ids.

Genes are sampled to a maximum length (the expressed genes by default, as scGPT); every random choice is drawn
from a generator seeded by ``(seed, epoch, cell index)``, so a cell's tokens do not depend on which process or
which batch it lands in (this is what makes DDP match single-process training). A cell's bins do not depend on the
epoch, so each cell is binned once and kept (its expressed genes and their bins) for the next epochs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from .._errors import CapeInputError

PAD_TOKEN = "<pad>"
CLS_TOKEN = "<cls>"
#: Value given to masked positions in the continuous (scGPT) input, as scGPT's ``mask_value``.
MASK_VALUE = -1.0
#: Value given to padded positions (ignored by attention through the key padding mask).
PAD_VALUE = -2.0
#: ``max_len="auto"``: cover every cell's gene tokens.
AUTO = "auto"
#: Most tokens ``max_len="auto"`` gives a cell (scGPT fine-tunes with 1,200); more are subsampled, with a warning.
MAX_AUTO_LEN = 1200
#: Most (gene, bin) entries a :class:`CellDataset` keeps binned between epochs (8 bytes each: about 1.6 GB).
BIN_CACHE_MAX_ENTRIES = 200_000_000


class GeneVocab:
    """Gene vocabulary: token string <-> index, with ``<pad>`` and ``<cls>`` special tokens.

    Parameters
    ----------
    tokens
        All tokens in index order. Must contain ``<pad>`` and ``<cls>`` (anywhere: imported scGPT vocabularies put
        them after the genes) and no duplicates.
    """

    def __init__(self, tokens: Sequence[str]) -> None:
        tokens = [str(t) for t in tokens]
        index = {t: i for i, t in enumerate(tokens)}
        if len(index) != len(tokens):
            dup = next(t for t in tokens if tokens.count(t) > 1)
            raise CapeInputError(f"gene vocabulary has duplicate token {dup!r}")
        for special in (PAD_TOKEN, CLS_TOKEN):
            if special not in index:
                raise CapeInputError(f"gene vocabulary lacks the special token {special!r}")
        self.tokens = tokens
        self._index = index
        self.pad_id = index[PAD_TOKEN]
        self.cls_id = index[CLS_TOKEN]

    @classmethod
    def from_genes(cls, genes: Sequence[str]) -> GeneVocab:
        """Vocabulary ``[<pad>, <cls>, *genes]``."""
        genes = [str(g) for g in genes]
        clash = {PAD_TOKEN, CLS_TOKEN} & set(genes)
        if clash:
            raise CapeInputError(f"gene name {sorted(clash)[0]!r} clashes with a special token")
        return cls([PAD_TOKEN, CLS_TOKEN, *genes])

    @classmethod
    def from_mapping(cls, mapping: dict[str, int]) -> GeneVocab:
        """From a ``{token: index}`` mapping (scGPT's ``vocab.json``); indices must be ``0..n-1``."""
        n = len(mapping)
        tokens: list[str | None] = [None] * n
        for tok, idx in mapping.items():
            if not 0 <= int(idx) < n or tokens[int(idx)] is not None:
                raise CapeInputError(f"vocabulary indices must be 0..{n - 1} without gaps; got {idx} for {tok!r}")
            tokens[int(idx)] = tok
        return cls(tokens)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: object) -> bool:
        return token in self._index

    def __getitem__(self, token: str) -> int:
        return self._index[token]

    @property
    def genes(self) -> list[str]:
        """The non-special tokens, in index order."""
        return [t for t in self.tokens if t not in (PAD_TOKEN, CLS_TOKEN)]

    def lookup(self, genes: Sequence[str]) -> np.ndarray:
        """Indices of ``genes``; ``-1`` for genes not in the vocabulary."""
        return np.array([self._index.get(str(g), -1) for g in genes], dtype=np.int64)

    def difference(self, genes: Sequence[str]) -> tuple[int, int]:
        """``(n_missing_from_vocab, n_vocab_genes_missing_from_genes)``."""
        genes_set = {str(g) for g in genes}
        vocab_set = set(self.genes)
        return len(genes_set - vocab_set), len(vocab_set - genes_set)

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({t: i for i, t in enumerate(self.tokens)}))

    @classmethod
    def from_json(cls, path: str | Path) -> GeneVocab:
        try:
            mapping = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CapeInputError(f"cannot read the gene vocabulary {path} ({type(err).__name__})") from err
        if not isinstance(mapping, dict):
            raise CapeInputError(f"{path} must map tokens to indices, got a JSON {type(mapping).__name__}")
        return cls.from_mapping(mapping)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GeneVocab) and self.tokens == other.tokens

    def __repr__(self) -> str:
        return f"GeneVocab({len(self.genes)} genes + <pad>, <cls>)"


# --------------------------------------------------------------------------------------------------- binning
def quantile_bin(values: np.ndarray, n_bins: int = 51) -> np.ndarray:
    """scGPT's per-cell quantile binning of one cell's expression vector.

    Zeros stay 0; the non-zero values are cut at the ``n_bins - 1`` quantiles ``linspace(0, 1, n_bins - 1)`` of
    the cell's own non-zero values and land in ``1..n_bins - 1``. Ties get the highest bin of their edge, so the
    map is deterministic and non-decreasing in the value (scGPT breaks ties at random).

    Parameters
    ----------
    values
        ``(n_genes,)`` non-negative expression of one cell.
    n_bins
        Number of levels including 0 (scGPT: 51).

    Returns
    -------
    ``(n_genes,)`` int64 bins in ``0..n_bins - 1``.
    """
    values = np.asarray(values, dtype=np.float64)
    if n_bins < 2:
        raise CapeInputError(f"n_bins must be at least 2, got {n_bins}")
    if np.any(values < 0):
        raise CapeInputError("quantile binning needs non-negative expression (log-normalised, not scaled data)")
    out = np.zeros(values.shape, dtype=np.int64)
    nz = values > 0
    if not nz.any():
        return out
    edges = np.quantile(values[nz], np.linspace(0.0, 1.0, n_bins - 1))
    # digitize: edges[i-1] <= x < edges[i] -> i; the largest value maps to len(edges) = n_bins - 1.
    out[nz] = np.clip(np.digitize(values[nz], edges), 1, n_bins - 1)
    return out


def log2_bin(values: np.ndarray, n_bins: int = 5) -> np.ndarray:
    """scBERT's bins: ``floor(v)`` clipped to ``n_bins`` for log2-normalised expression ``v = log2(1 + x)``.

    Returns ``(n_genes,)`` int64 tokens in ``0..n_bins`` (``n_bins + 1`` levels, scBERT's ``bin_num = 5``).
    """
    values = np.asarray(values, dtype=np.float64)
    if np.any(values < 0):
        raise CapeInputError("log2 binning needs non-negative expression (log-normalised, not scaled data)")
    return np.minimum(np.floor(values), n_bins).astype(np.int64)


BINNINGS = {"quantile": quantile_bin, "log2": log2_bin}


def n_value_levels(binning: str, n_bins: int) -> int:
    """Number of distinct binned values: ``n_bins`` for quantile bins, ``n_bins + 1`` for log2 bins."""
    return n_bins if binning == "quantile" else n_bins + 1


# --------------------------------------------------------------------------------------------------- dataset
@dataclass
class TokenizerConfig:
    """How a cell becomes tokens.

    Attributes
    ----------
    binning
        ``"quantile"`` (scGPT) or ``"log2"`` (scBERT).
    n_bins
        51 for scGPT; 5 for scBERT.
    max_len
        Maximum sequence length including ``<cls>``; longer cells are subsampled at random (with a warning that
        says how many cells lost how many genes). ``"auto"``: one more than the most gene tokens any cell of the
        data has (:func:`covering_max_len`), resolved when a model is built.
    include_zero_genes
        Use every vocabulary gene of the cell (zeros included) rather than only the expressed ones.
    """

    binning: str = "quantile"
    n_bins: int = 51
    max_len: int | str = AUTO
    include_zero_genes: bool = False

    def __post_init__(self) -> None:
        if self.binning not in BINNINGS:
            raise CapeInputError(f"unknown binning {self.binning!r}; choose from {sorted(BINNINGS)}")
        if self.max_len != AUTO and (isinstance(self.max_len, bool) or not isinstance(self.max_len, int | np.integer)
                                     or self.max_len < 2):
            raise CapeInputError(f"max_len must be 'auto' or at least 2 (<cls> and one gene), got {self.max_len!r}")


def covering_max_len(tokens_per_cell: np.ndarray, ceiling: int = MAX_AUTO_LEN) -> int:
    """The ``max_len`` that keeps every gene token of every cell: the most tokens of a cell plus ``<cls>``, at
    least 2 and at most ``ceiling`` (attention costs grow with its square; cells beyond it are reported)."""
    most = int(np.max(tokens_per_cell)) if np.size(tokens_per_cell) else 1
    return int(min(max(most + 1, 2), ceiling))


def truncation_summary(tokens_per_cell: np.ndarray, max_len: int) -> dict[str, float]:
    """How many cells ``max_len`` truncates and how many gene tokens they lose (mean and most)."""
    lost = np.clip(np.asarray(tokens_per_cell, dtype=np.int64) - (int(max_len) - 1), 0, None)
    cut = lost > 0
    return {"max_len": int(max_len), "n_cells": int(lost.size), "n_cells_truncated": int(cut.sum()),
            "mean_genes_lost": float(lost[cut].mean()) if cut.any() else 0.0,
            "max_genes_lost": int(lost.max()) if lost.size else 0,
            "covering_max_len": int(np.max(tokens_per_cell)) + 1 if lost.size else 2}


def _item_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) % (2**32), int(epoch), int(index)])


class CellDataset(torch.utils.data.Dataset):
    """Cells of an expression matrix as token sequences.

    Parameters
    ----------
    X
        ``(n_cells, n_genes)`` non-negative expression (dense or sparse), log-normalised.
    gene_ids
        ``(n_genes,)`` vocabulary index of each column; ``-1`` drops the column.
    vocab
        The vocabulary (for ``<cls>``).
    config
        Tokeniser settings.
    labels
        Optional ``(n_cells,)`` integer labels returned as ``"label"``.
    mask_ratio
        Fraction of gene tokens (never ``<cls>``) whose value is hidden for masked value prediction.
    seed
        Seed of gene sampling and masking; call :meth:`set_epoch` to draw afresh each epoch.
    cell_targets
        Also return ``"cell_values"``: the binned value of every vocabulary gene of the data (zeros included, in
        the order of :attr:`target_ids`), the target of the cell-expression objective.
    """

    def __init__(self, X, gene_ids: np.ndarray, vocab: GeneVocab, config: TokenizerConfig, *,
                 labels: np.ndarray | None = None, mask_ratio: float = 0.0, seed: int = 0,
                 cell_targets: bool = False) -> None:
        self.X = sp.csr_matrix(X) if sp.issparse(X) else np.asarray(X)
        self.gene_ids = np.asarray(gene_ids, dtype=np.int64)
        if self.gene_ids.shape[0] != self.X.shape[1]:
            raise CapeInputError(f"{self.X.shape[1]} genes in the matrix but {self.gene_ids.shape[0]} gene ids")
        self.keep = np.flatnonzero(self.gene_ids >= 0)
        if self.keep.size == 0:
            raise CapeInputError("no gene of the data is in the model's gene vocabulary")
        self.vocab = vocab
        self.config = config
        self.labels = None if labels is None else np.asarray(labels, dtype=np.int64)
        if not 0.0 <= mask_ratio < 1.0:
            raise CapeInputError(f"mask_ratio must be in [0, 1), got {mask_ratio}")
        self.mask_ratio = float(mask_ratio)
        self.seed = int(seed)
        self.cell_targets = bool(cell_targets)
        self.epoch = 0
        self._bins: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._bins_entries = 0

    @property
    def target_ids(self) -> np.ndarray:
        """Vocabulary index of each entry of ``"cell_values"`` (the data's genes that the vocabulary knows)."""
        return self.gene_ids[self.keep]

    def tokens_per_cell(self) -> np.ndarray:
        """Gene tokens of each cell before ``max_len`` cuts them: its expressed (non-zero) vocabulary genes, or
        all of them with ``include_zero_genes``."""
        if self.config.include_zero_genes:
            return np.full(len(self), self.keep.size, dtype=np.int64)
        X = self.X[:, self.keep]
        if sp.issparse(X):
            X = sp.csr_matrix(X)
            X.eliminate_zeros()
            return np.diff(X.indptr).astype(np.int64)
        return np.count_nonzero(np.asarray(X) > 0, axis=1).astype(np.int64)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.X.shape[0]

    def _row(self, i: int) -> np.ndarray:
        row = self.X[i]
        row = row.toarray().ravel() if sp.issparse(row) else np.asarray(row).ravel()
        return row[self.keep]

    def _expressed_bins(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions (among the vocabulary genes) of cell ``i``'s expressed genes and their bins; computed once,
        kept while the cache holds fewer than :data:`BIN_CACHE_MAX_ENTRIES` entries."""
        hit = self._bins.get(i)
        if hit is None:
            values = self._row(i)
            expressed = np.flatnonzero(values > 0)
            binned = BINNINGS[self.config.binning](values, self.config.n_bins)
            hit = (expressed.astype(np.int32), binned[expressed].astype(np.int32))
            if self._bins_entries + expressed.size <= BIN_CACHE_MAX_ENTRIES:
                self._bins[i] = hit
                self._bins_entries += expressed.size
        return hit

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        cfg = self.config
        expressed, expressed_bins = self._expressed_bins(int(i))
        # Zeros bin to 0 under both binnings, so the full vector is the expressed genes' bins and zeros.
        binned = np.zeros(self.keep.size, dtype=np.int64)
        binned[expressed] = expressed_bins
        genes = self.gene_ids[self.keep]
        pick = np.arange(genes.size) if cfg.include_zero_genes else expressed.astype(np.int64)
        rng = _item_rng(self.seed, self.epoch, int(i))
        if pick.size > cfg.max_len - 1:
            pick = np.sort(rng.choice(pick, size=cfg.max_len - 1, replace=False))
        gene_tokens = np.concatenate([[self.vocab.cls_id], genes[pick]]).astype(np.int64)
        # <cls> carries value 0 (as scGPT's tokenize_and_pad_batch).
        token_values = np.concatenate([[0], binned[pick]]).astype(np.float32)
        mask = np.zeros(gene_tokens.size, dtype=bool)
        if self.mask_ratio > 0 and pick.size > 0:
            n_mask = round(self.mask_ratio * pick.size)
            if n_mask:
                mask[1 + rng.choice(pick.size, size=n_mask, replace=False)] = True
        item = {"gene_ids": gene_tokens, "values": token_values, "mask": mask}
        if self.cell_targets:
            item["cell_values"] = binned.astype(np.float32)
        if self.labels is not None:
            item["label"] = np.int64(self.labels[int(i)])
        return item


def collate_cells(batch: list[dict[str, np.ndarray]], *, pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a list of :class:`CellDataset` items to the longest sequence.

    Returns ``gene_ids (B, L)`` long (``pad_id`` at padding), ``values (B, L)`` float (``PAD_VALUE`` at padding),
    ``masked_values`` (``values`` with ``MASK_VALUE`` at masked positions), ``mask (B, L)`` bool (masked for
    prediction), ``padding_mask (B, L)`` bool (True = padding, PyTorch's convention), and ``label (B,)`` and
    ``cell_values (B, n_genes)`` if present.
    """
    length = max(item["gene_ids"].size for item in batch)
    n = len(batch)
    gene_ids = torch.full((n, length), pad_id, dtype=torch.long)
    values = torch.full((n, length), PAD_VALUE, dtype=torch.float32)
    mask = torch.zeros((n, length), dtype=torch.bool)
    padding = torch.ones((n, length), dtype=torch.bool)
    for b, item in enumerate(batch):
        m = item["gene_ids"].size
        gene_ids[b, :m] = torch.from_numpy(item["gene_ids"])
        values[b, :m] = torch.from_numpy(item["values"])
        mask[b, :m] = torch.from_numpy(item["mask"])
        padding[b, :m] = False
    out = {"gene_ids": gene_ids, "values": values, "masked_values": values.masked_fill(mask, MASK_VALUE),
           "mask": mask, "padding_mask": padding}
    if "label" in batch[0]:
        out["label"] = torch.tensor([int(item["label"]) for item in batch], dtype=torch.long)
    if "cell_values" in batch[0]:
        out["cell_values"] = torch.from_numpy(np.stack([item["cell_values"] for item in batch]))
    return out


class CellCollator:
    """Picklable collate function (DataLoader workers) around :func:`collate_cells`."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = int(pad_id)

    def __call__(self, batch: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
        return collate_cells(batch, pad_id=self.pad_id)
