"""Whether a matrix is cells × genes, as cape reads it, or a genes × cells table read the other way round.

Two kinds of evidence, both read off the matrix itself:

- **names**: Ensembl gene IDs (``ENSG…``, ``ENSMUSG…``) or ``gene``-numbered names among the row names, or cell
  barcodes (a run of 12 or more of A/C/G/T/N, as 10x and Drop-seq write them) or ``cell``-numbered names among the
  column names;
- **totals per row**: cells have library sizes within about a decade of one another, while genes range over
  several decades, many near zero. A row spread far wider than the column spread means the rows are genes. Empty
  rows and columns (empty droplets, genes never detected) are left out of both spreads.

The check is one-sided and conservative: names that say the rows are cells (barcodes in the rows, gene IDs in the
columns) always win, and totals decide only where the names say nothing.
"""

from __future__ import annotations

import re

import anndata as ad
import numpy as np
import scipy.sparse as sp

from .._errors import CapeInputError

#: Ensembl gene IDs of any species (ENSG, ENSMUSG, ENSDARG…), with or without a version suffix.
_ENSEMBL = re.compile(r"^ENS[A-Z]{0,6}G\d{6,}(\.\d+)?$")
#: ``gene12``, ``GENE00012``, ``gene_12``: numbered gene names of simulators and toy tables.
_GENE_NUMBERED = re.compile(r"^gene[_.\-]?\d+$", re.IGNORECASE)
#: A cell barcode somewhere in the name (``AAACCTGAGAAGGCCT-1``, ``sample1_ACGT…``): no gene symbol has such a run.
_BARCODE = re.compile(r"[ACGTN]{12,}")
#: ``cell12``, ``Cell_0012``, ``barcode7``: numbered cell names.
_CELL_NUMBERED = re.compile(r"^(cell|barcode)[_.\-]?\d+$", re.IGNORECASE)
#: A gene symbol's shape (``CD3E``, ``Cd3e``, ``HLA-DRA``, ``RP11-34P13.7``): letters first, up to 20 characters.
_SYMBOL = re.compile(r"^[A-Za-z][A-Za-z0-9]*([.\-][A-Za-z0-9]+)*$")

#: Share of the names (of those sampled) that must match for the names to count as evidence.
NAME_SHARE = 0.5
#: Names looked at per axis: evenly spaced, so that a long file costs no more than a short one.
NAME_SAMPLE = 500
#: Totals rule: rows count as genes when the 10–90 % spread of log10(1 + row total) is at least this many decades…
ROW_SPREAD_MIN = 1.5
#: …and exceeds the columns' spread by at least this many decades (cells × genes is the other way round).
SPREAD_MARGIN = 1.0
#: Fewest rows and columns for the totals rule: quantiles of a handful of totals say nothing.
MIN_AXIS = 20

#: What the refusal tells the user to do: every way cape offers to read the table the other way round.
TRANSPOSE_HINT = ("cape reads cells × genes: if so, transpose it (cape preprocess --transpose; workflow: "
                  "preprocess.transpose: true; Python: cape.data.read(path, transpose=True) or adata.T)")


def _share(names, pattern: re.Pattern, *, search: bool = False) -> float:
    names = np.asarray(names, dtype=str)
    if names.size == 0:
        return 0.0
    sample = names[np.linspace(0, names.size - 1, min(names.size, NAME_SAMPLE)).astype(int)]
    match = pattern.search if search else pattern.match
    return float(np.mean([match(n) is not None for n in sample]))


def _gene_like(names) -> float:
    return max(_share(names, _ENSEMBL), _share(names, _GENE_NUMBERED))


def _cell_like(names) -> float:
    return max(_share(names, _BARCODE, search=True), _share(names, _CELL_NUMBERED))


def _symbol_like(names) -> float:
    names = np.asarray(names, dtype=str)
    short = names[np.char.str_len(names) <= 20] if names.size else names
    return _share(short, _SYMBOL) * (short.size / max(names.size, 1)) if short.size else 0.0


def _names_verdict(rows, cols) -> str | None:
    """``"genes"`` (the rows are genes, with the reason), ``"cells"`` or ``None`` (the names do not say)."""
    if _cell_like(rows) >= NAME_SHARE or _gene_like(cols) >= NAME_SHARE:
        return "cells"
    if _gene_like(rows) >= NAME_SHARE:
        return "genes"
    if _cell_like(cols) >= NAME_SHARE and _symbol_like(rows) >= NAME_SHARE:
        return "genes"
    return None


def _log_totals(x, axis: int) -> np.ndarray:
    totals = np.asarray(x.sum(axis=axis)).ravel().astype(np.float64)
    return np.log10(1.0 + np.clip(totals, 0.0, None))


def _spread(values: np.ndarray) -> float:
    # Empty rows and columns are left out: empty droplets in an unfiltered matrix would otherwise stretch the
    # cells' spread past the genes'.
    values = values[values > 0]
    if values.size < MIN_AXIS:
        return 0.0
    lo, hi = np.quantile(values, [0.1, 0.9])
    return float(hi - lo)


def totals_spread(x) -> tuple[float, float]:
    """The 10–90 % spread of log10(1 + total), in decades, over the non-empty rows and over the non-empty columns
    of ``x``."""
    x = x if sp.issparse(x) else np.asarray(x)
    return _spread(_log_totals(x, 1)), _spread(_log_totals(x, 0))


def rows_look_like_genes(adata: ad.AnnData) -> str | None:
    """Why the rows of ``adata`` look like genes rather than cells, or ``None`` where they may well be cells.

    Parameters
    ----------
    adata
        The matrix as read: rows ``obs_names``, columns ``var_names``, non-negative ``X``.

    Returns
    -------
    A short reason (which names or totals gave the rows away), or ``None``.
    """
    rows, cols = adata.obs_names.astype(str), adata.var_names.astype(str)
    verdict = _names_verdict(rows, cols)
    if verdict == "genes":
        return f"row names such as {rows[0]!r} look like genes and column names such as {cols[0]!r} do not"
    if verdict == "cells" or adata.n_obs < MIN_AXIS or adata.n_vars < MIN_AXIS or adata.X is None:
        return None
    row_spread, col_spread = totals_spread(adata.X)
    if row_spread >= ROW_SPREAD_MIN and row_spread >= col_spread + SPREAD_MARGIN:
        return (f"row totals span {row_spread:.1f} decades (10–90 %), as genes' do, against {col_spread:.1f} for "
                "the columns; cells' library sizes are alike")
    return None


def check_orientation(adata: ad.AnnData, *, source: str = "input") -> None:
    """Refuse, in one line, a matrix whose rows are evidently genes (see :func:`rows_look_like_genes`).

    Raises
    ------
    cape.CapeInputError
        The rows look like genes; the message names the transpose options.
    """
    reason = rows_look_like_genes(adata)
    if reason is not None:
        raise CapeInputError(f"{source} looks like genes × cells ({adata.n_obs} rows × {adata.n_vars} columns): "
                             f"{reason}; {TRANSPOSE_HINT}")
