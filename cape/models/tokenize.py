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

A DataLoader fetches whole batches through :meth:`CellDataset.__getitems__`: the batch's rows are binned, sampled,
masked and padded with array operations over all its cells at once (:class:`CellBatch`), giving the same tokens,
values and masks as :meth:`CellDataset.__getitem__` cell by cell; only the seeded draws stay per cell.
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


def quantile_bin_segments(values: np.ndarray, counts: np.ndarray, n_bins: int = 51) -> np.ndarray:
    """:func:`quantile_bin` of many cells at once, on their non-zero values.

    Parameters
    ----------
    values
        The positive expression values of the cells, cell after cell (each cell's in any order).
    counts
        ``(n_cells,)`` number of values of each cell.
    n_bins
        Number of levels including 0 (scGPT: 51).

    Returns
    -------
    ``(values.size,)`` int64 bins in ``1..n_bins - 1``: for each cell, ``quantile_bin(row)[row > 0]`` of a row
    holding its values (the same numbers, not merely the same rule).
    """
    values = np.asarray(values, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    if n_bins < 2:
        raise CapeInputError(f"n_bins must be at least 2, got {n_bins}")
    if values.size == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    cells = np.flatnonzero(counts > 0)
    n, start = counts[cells], starts[cells]
    # The cells' values sorted row by row in one padded array (padding +inf sorts last and is never read).
    rows = np.repeat(np.arange(cells.size), n)
    padded = np.full((cells.size, int(n.max())), np.inf)
    padded[rows, np.arange(values.size) - np.repeat(start, n)] = values
    padded.sort(axis=1)
    # np.quantile's default ("linear") method term by term, so that the edges are bit for bit np.quantile's: the
    # virtual index (n - 1) q, its floor and the next index (both the last value at or beyond n - 1), the weight
    # taken against the clamped floor, and numpy's two-sided lerp.
    q = np.linspace(0.0, 1.0, n_bins - 1)
    last = (n - 1)[:, None]
    virtual = last * q[None, :]
    above = virtual >= last
    previous = np.floor(virtual).astype(np.intp)
    previous[above] = -1
    following = previous + 1
    following[above] = -1
    gamma = virtual - previous
    r = np.arange(cells.size)[:, None]
    a = padded[r, np.where(previous < 0, last, previous)]
    b = padded[r, np.where(following < 0, last, following)]
    diff = b - a
    edges = a + diff * gamma
    upper = gamma >= 0.5
    edges[upper] = (b - diff * (1 - gamma))[upper]
    # np.digitize(x, edges) is searchsorted(edges, x, "right") for non-decreasing edges; it refuses others, and so
    # does quantile_bin, to which such a cell goes.
    unordered = np.any(edges[:, 1:] < edges[:, :-1], axis=1).tolist()
    out = np.empty(values.size, dtype=np.int64)
    for k, (s0, m) in enumerate(zip(start.tolist(), n.tolist(), strict=True)):
        cell = values[s0:s0 + m]
        out[s0:s0 + m] = quantile_bin(cell, n_bins)[cell > 0] if unordered[k] else \
            np.searchsorted(edges[k], cell, side="right")
    return np.clip(out, 1, n_bins - 1)


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


# numpy's SeedSequence and PCG64 seeding constants (numpy/random/bit_generator.pyx, pcg64.h).
_HASH_INIT_A, _HASH_MULT_A, _HASH_INIT_B, _HASH_MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645
_U32, _U128 = np.uint64(0xFFFFFFFF), (1 << 128) - 1


def _item_states(seed: int, epoch: int, indices: np.ndarray) -> list[tuple[int, int]] | None:
    """The PCG64 ``(state, inc)`` of ``_item_rng(seed, epoch, i)`` for every ``i`` of ``indices``, without building
    a SeedSequence per cell: its hash of the entropy words ``[seed mod 2**32, epoch, i]`` runs on all cells at
    once (its multipliers do not depend on the data), then PCG64's two seeding steps in 128-bit integers.

    None when ``epoch`` or an index needs more than one 32-bit word (the hash then reads more words).
    """
    indices = np.asarray(indices, dtype=np.int64)
    if not 0 <= epoch < 2**32 or (indices.size and not (0 <= indices.min() and indices.max() < 2**32)):
        return None
    hash_a = _HASH_INIT_A

    def hashmix(value: np.ndarray) -> np.ndarray:
        nonlocal hash_a
        value = value ^ np.uint64(hash_a)
        hash_a = (hash_a * _HASH_MULT_A) & 0xFFFFFFFF
        value = (value * np.uint64(hash_a)) & _U32
        return value ^ (value >> np.uint64(16))

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        result = (np.uint64(_MIX_MULT_L) * x - np.uint64(_MIX_MULT_R) * y) & _U32
        return result ^ (result >> np.uint64(16))

    shape = indices.shape
    words = [np.full(shape, int(seed) % (2**32), dtype=np.uint64), np.full(shape, epoch, dtype=np.uint64),
             indices.astype(np.uint64), np.zeros(shape, dtype=np.uint64)]
    pool = [hashmix(w) for w in words]                    # three entropy words, padded to the pool of four
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    hash_b, out = _HASH_INIT_B, []
    for k in range(8):                                    # generate_state(4, uint64): eight 32-bit words
        value = pool[k % 4] ^ np.uint64(hash_b)
        hash_b = (hash_b * _HASH_MULT_B) & 0xFFFFFFFF
        value = (value * np.uint64(hash_b)) & _U32
        out.append(value ^ (value >> np.uint64(16)))
    seeded = [(out[2 * j] | (out[2 * j + 1] << np.uint64(32))).tolist() for j in range(4)]
    states = []
    for high, low, seq_high, seq_low in zip(*seeded, strict=True):
        inc = ((((seq_high << 64) | seq_low) << 1) | 1) & _U128
        states.append(((((inc + ((high << 64) | low)) * _PCG_MULT) + inc) & _U128, inc))
    return states


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
        # The batch path reads CSR rows directly: duplicate entries summed (as toarray does) in a copy, never in
        # the caller's matrix; and each column's position among the vocabulary genes (-1: dropped).
        self._csr = self.X
        if sp.issparse(self.X) and not self.X.has_canonical_format:
            self._csr = self.X.copy()
            self._csr.sum_duplicates()
        self._column_position = np.full(self.gene_ids.size, -1, dtype=np.int64)
        self._column_position[self.keep] = np.arange(self.keep.size)

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

    def _expressed_values(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``rows``' expressed vocabulary genes: the number of each row, then their positions (among the vocabulary
        genes, increasing within a row) and values, row after row."""
        if sp.issparse(self._csr):
            indptr = self._csr.indptr
            begin, end = indptr[rows].astype(np.int64), indptr[rows + 1].astype(np.int64)
            lengths = end - begin
            entries = np.repeat(begin - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + np.arange(
                int(lengths.sum()))
            position = self._column_position[self._csr.indices[entries]]
            values = self._csr.data[entries]
            row_of = np.repeat(np.arange(rows.size), lengths)
            kept = position >= 0
            position, values, row_of = position[kept], values[kept], row_of[kept]
        else:
            block = np.asarray(self.X[rows][:, self.keep])
            row_of, position = np.nonzero(block != 0)
            values = block[row_of, position]
        if np.any(values < 0):
            raise CapeInputError(f"{self.config.binning} binning needs non-negative expression (log-normalised, not "
                                 "scaled data)")
        expressed = values > 0
        row_of = row_of[expressed]
        return np.bincount(row_of, minlength=rows.size), position[expressed], values[expressed]

    def _batch_bins(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_expressed_bins` of many cells: the number of expressed genes of each, then their positions and
        bins, cell after cell; the cells not yet kept are binned together and kept as the cache allows."""
        found = [self._bins.get(i) for i in rows.tolist()]
        todo = np.array([k for k, hit in enumerate(found) if hit is None], dtype=np.int64)
        if todo.size:
            counts, position, values = self._expressed_values(rows[todo])
            if self.config.binning == "quantile":
                binned = quantile_bin_segments(values, counts, self.config.n_bins)
            else:
                binned = np.minimum(np.floor(values.astype(np.float64)), self.config.n_bins).astype(np.int64)
            position, binned = position.astype(np.int32), binned.astype(np.int32)
            ends = np.cumsum(counts).tolist()
            for k, i, lo, hi in zip(todo.tolist(), rows[todo].tolist(), [0, *ends[:-1]], ends, strict=True):
                hit = (position[lo:hi], binned[lo:hi])
                found[k] = hit
                if i not in self._bins and self._bins_entries + hit[0].size <= BIN_CACHE_MAX_ENTRIES:
                    self._bins[i] = hit
                    self._bins_entries += hit[0].size
        counts = np.array([hit[0].size for hit in found], dtype=np.int64)
        if not found:
            return counts, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return (counts, np.concatenate([hit[0] for hit in found]).astype(np.int64),
                np.concatenate([hit[1] for hit in found]).astype(np.int64))

    def __getitems__(self, indices: Sequence[int]) -> CellBatch:
        """The cells ``indices`` as one padded batch (what DataLoaders fetch): the tokens, values and masks of
        :meth:`__getitem__` for each cell, made with array operations over the whole batch; only the seeded draws
        (gene sampling beyond ``max_len``, masking) are made cell by cell, from the same generators."""
        cfg = self.config
        rows = np.asarray(indices, dtype=np.int64).reshape(-1)
        n_cells, n_genes = rows.size, self.keep.size
        counts, position, binned = self._batch_bins(rows)
        row_of = np.repeat(np.arange(n_cells), counts)
        full = None
        if cfg.include_zero_genes or self.cell_targets:
            full = np.zeros((n_cells, n_genes), dtype=np.int64)
            full[row_of, position] = binned
        if cfg.include_zero_genes:
            # Every vocabulary gene is a candidate token, in vocabulary-gene order.
            counts = np.full(n_cells, n_genes, dtype=np.int64)
            position, binned = np.tile(np.arange(n_genes), n_cells), full.ravel()
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        n_tokens = np.minimum(counts, cfg.max_len - 1)
        # Python's round, as __getitem__ (both round half to even).
        n_mask = np.rint(self.mask_ratio * n_tokens).astype(np.int64) if self.mask_ratio > 0 else \
            np.zeros(n_cells, dtype=np.int64)
        chosen = np.ones(position.size, dtype=bool)
        mask_cols = []
        drawn = np.flatnonzero((counts > n_tokens) | (n_mask > 0))
        # Each drawing cell's generator is _item_rng's, set on one reused generator (seeding one per cell would
        # cost more than the draws); plain Python numbers in the loop, which runs once per drawing cell.
        states = _item_states(self.seed, self.epoch, rows[drawn])
        reused = np.random.Generator(np.random.PCG64(0))
        for j, (i, lo, n, m, n_masked) in enumerate(zip(
                rows[drawn].tolist(), starts[drawn].tolist(), counts[drawn].tolist(), n_tokens[drawn].tolist(),
                n_mask[drawn].tolist(), strict=True)):
            if states is None:
                rng = _item_rng(self.seed, self.epoch, i)
            else:
                rng = reused
                rng.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": states[j][0],
                                           "inc": states[j][1]}, "has_uint32": 0, "uinteger": 0}
            if n > m:
                # rng.choice(pick, ...) is pick[rng.choice(pick.size, ...)]: the same draws on positions.
                chosen[lo:lo + n] = False
                chosen[lo + rng.choice(n, size=m, replace=False)] = True
            if n_masked:
                mask_cols.append(1 + rng.choice(m, size=n_masked, replace=False))
        source = np.flatnonzero(chosen) if not chosen.all() else np.arange(position.size)
        length = int(n_tokens.max(initial=0)) + 1
        token_row = np.repeat(np.arange(n_cells), n_tokens)
        token_col = 1 + np.arange(source.size) - np.repeat(np.cumsum(n_tokens) - n_tokens, n_tokens)
        gene_ids = np.full((n_cells, length), self.vocab.pad_id, dtype=np.int64)
        gene_ids[:, 0] = self.vocab.cls_id
        gene_ids[token_row, token_col] = self.gene_ids[self.keep][position[source]]
        values = np.full((n_cells, length), PAD_VALUE, dtype=np.float32)
        values[:, 0] = 0.0
        values[token_row, token_col] = binned[source]
        mask = np.zeros((n_cells, length), dtype=bool)
        if mask_cols:
            masked = drawn[n_mask[drawn] > 0]
            mask[np.repeat(masked, n_mask[masked]), np.concatenate(mask_cols)] = True
        return CellBatch(gene_ids=gene_ids, values=values, mask=mask, lengths=n_tokens + 1,
                         pad_id=self.vocab.pad_id,
                         label=None if self.labels is None else self.labels[rows],
                         cell_values=full.astype(np.float32) if self.cell_targets else None)

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


@dataclass(eq=False)
class CellBatch(Sequence):
    """Cells tokenised and padded together (:meth:`CellDataset.__getitems__`); also a sequence of the per-cell
    items of :meth:`CellDataset.__getitem__`, so that it stands wherever a list of items does.

    Attributes
    ----------
    gene_ids, values, mask
        ``(B, L)`` tokens (``pad_id`` at padding), values (``PAD_VALUE`` at padding) and the masked positions.
    lengths
        ``(B,)`` tokens of each cell, ``<cls>`` included.
    pad_id
        The padding token of ``gene_ids``.
    label, cell_values
        ``(B,)`` labels and ``(B, n_genes)`` binned values of every vocabulary gene, when the dataset has them.
    """

    gene_ids: np.ndarray
    values: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    pad_id: int
    label: np.ndarray | None = None
    cell_values: np.ndarray | None = None

    def __len__(self) -> int:
        return self.lengths.size

    def __getitem__(self, b):
        if isinstance(b, slice):
            return [self[k] for k in range(*b.indices(len(self)))]
        m = int(self.lengths[b])
        item = {"gene_ids": self.gene_ids[b, :m].copy(), "values": self.values[b, :m].copy(),
                "mask": self.mask[b, :m].copy()}
        if self.cell_values is not None:
            item["cell_values"] = self.cell_values[b].copy()
        if self.label is not None:
            item["label"] = np.int64(self.label[b])
        return item

    def collate(self, pad_id: int) -> dict[str, torch.Tensor]:
        """The tensors of :func:`collate_cells`, padded with ``pad_id``."""
        padding = torch.from_numpy(np.arange(self.gene_ids.shape[1])[None, :] >= self.lengths[:, None])
        gene_ids = torch.from_numpy(self.gene_ids)
        if int(pad_id) != self.pad_id:
            gene_ids = gene_ids.masked_fill(padding, int(pad_id))
        values, mask = torch.from_numpy(self.values), torch.from_numpy(self.mask)
        out = {"gene_ids": gene_ids, "values": values, "masked_values": values.masked_fill(mask, MASK_VALUE),
               "mask": mask, "padding_mask": padding}
        if self.label is not None:
            out["label"] = torch.from_numpy(np.asarray(self.label, dtype=np.int64))
        if self.cell_values is not None:
            out["cell_values"] = torch.from_numpy(self.cell_values)
        return out


def collate_cells(batch: Sequence[dict[str, np.ndarray]], *, pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a list of :class:`CellDataset` items to the longest sequence (a :class:`CellBatch` is padded already).

    Returns ``gene_ids (B, L)`` long (``pad_id`` at padding), ``values (B, L)`` float (``PAD_VALUE`` at padding),
    ``masked_values`` (``values`` with ``MASK_VALUE`` at masked positions), ``mask (B, L)`` bool (masked for
    prediction), ``padding_mask (B, L)`` bool (True = padding, PyTorch's convention), and ``label (B,)`` and
    ``cell_values (B, n_genes)`` if present.
    """
    if isinstance(batch, CellBatch):
        return batch.collate(pad_id)
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


#: The padding each (B, L) tensor of a batch gets beyond its longest cell (see :func:`pad_to_multiple`).
_PAD_FILL = {"gene_ids": None, "values": PAD_VALUE, "masked_values": PAD_VALUE, "mask": False, "padding_mask": True}


def pad_to_multiple(batch: dict[str, torch.Tensor], multiple: int, pad_id: int) -> dict[str, torch.Tensor]:
    """``batch`` (from :func:`collate_cells`) padded to a sequence length that is a multiple of ``multiple``.

    Padding is masked out of attention and losses, so the model computes the same thing; but a GPU's attention
    kernels are planned per sequence length, and batches padded to their own longest cell bring a new length (a
    new plan) almost every step. Rounding up to a multiple of 64 leaves a handful of lengths.
    """
    length = batch["gene_ids"].shape[1]
    extra = -length % max(int(multiple), 1)
    if not extra:
        return batch
    out = dict(batch)
    for key, fill in _PAD_FILL.items():
        if key in batch:
            out[key] = torch.nn.functional.pad(batch[key], (0, extra), value=pad_id if fill is None else fill)
    return out


class CellCollator:
    """Picklable collate function (DataLoader workers) around :func:`collate_cells`, padding every batch to a
    multiple of ``pad_multiple`` tokens (1: to its longest cell; see :func:`pad_to_multiple`)."""

    def __init__(self, pad_id: int, pad_multiple: int = 1) -> None:
        self.pad_id, self.pad_multiple = int(pad_id), int(pad_multiple)

    def __call__(self, batch: Sequence[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
        return pad_to_multiple(collate_cells(batch, pad_id=self.pad_id), self.pad_multiple, self.pad_id)
