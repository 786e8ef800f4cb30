"""Reading user files into AnnData, with the validation every cape step relies on."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import scanpy as sc
import scipy.sparse as sp

from .._errors import CapeInputError

#: Fewest cells a file may hold: one cell has no variation across cells to learn from.
MIN_CELLS = 2

#: File suffixes :func:`read` understands, and the scanpy/anndata reader used for each.
SUPPORTED_SUFFIXES = (".h5ad", ".h5", ".loom", ".csv", ".zarr")


def read(path: str | os.PathLike, *, expect_counts: bool | None = None, validate: bool = True,
         transpose: bool = False) -> ad.AnnData:
    """Read a single-cell data file and validate it.

    The reader is chosen by suffix: ``.h5ad`` (AnnData), ``.h5`` (10x Genomics HDF5, via
    :func:`scanpy.read_10x_h5`), ``.loom``, ``.csv`` (cells × genes, first column = cell names, header = gene
    names) and ``.zarr``.

    Parameters
    ----------
    path
        File to read.
    expect_counts
        Whether ``X`` must hold non-negative values (counts or normalised expression). ``None`` (default)
        requires non-negativity unless ``X`` is clearly a scaled/centred matrix produced by a previous step
        (``uns`` holds scanpy's ``"pca"`` or ``"scale"`` bookkeeping).
    validate
        Run :func:`validate_adata` (recommended).
    transpose
        The file holds genes × cells (rows are genes): swap rows and columns after reading, so that cells are rows.

    Returns
    -------
    The AnnData, with unique gene names.

    Raises
    ------
    cape.CapeInputError
        Missing or unreadable file, unsupported suffix, or invalid content (see :func:`validate_adata`).
    """
    p = Path(path)
    if not p.exists():
        raise CapeInputError(f"input file not found: {p}")
    suffix = check_suffix(p)
    try:
        adata = _read_by_suffix(p, suffix)
    except CapeInputError:
        raise
    except Exception as err:  # readers raise many types (OSError, KeyError, h5py errors) for corrupt files
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CapeInputError(f"cannot read {p} as {suffix} ({type(err).__name__}: {first})") from err
    if transpose:
        adata = _transposed(adata)
    if validate:
        validate_adata(adata, source=str(p), expect_counts=expect_counts)
    return adata


def _transposed(adata: ad.AnnData) -> ad.AnnData:
    """Rows and columns swapped, a sparse X kept row-major (cells are sliced by row downstream)."""
    out = adata.T.copy()
    if sp.issparse(out.X):
        out.X = sp.csr_matrix(out.X)
    return out


def check_suffix(path: str | os.PathLike) -> str:
    """The file's suffix (lower case), refused in one line unless :func:`read` can read it."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise CapeInputError(f"cannot read {p.name}: unsupported file type {suffix or '(none)'}; "
                             f"use one of {', '.join(SUPPORTED_SUFFIXES)}")
    return suffix


def obs_columns(path: str | os.PathLike) -> list[str] | None:
    """The cell annotation columns of a file, read without its matrix, so that a misspelled column can be refused
    before any work: ``.h5ad`` (``obs``) and ``.loom`` (column attributes); ``[]`` for ``.csv`` and 10x ``.h5``,
    which carry none; ``None`` where they are not known cheaply (``.zarr``, or a file that does not open: reading
    it reports that).
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in (".csv", ".h5"):
        return []
    if suffix not in (".h5ad", ".loom"):
        return None
    try:
        with h5py.File(p, "r") as f:
            if suffix == ".loom":
                return [str(k) for k in f["col_attrs"].keys()] if "col_attrs" in f else []
            obs = f["obs"]
            if isinstance(obs, h5py.Dataset):  # anndata < 0.7: one compound table, the index among its fields
                return [str(n) for n in obs.dtype.names or () if n != "index"]
            order = obs.attrs.get("column-order", [])
            return [c.decode() if isinstance(c, bytes) else str(c) for c in np.atleast_1d(order)]
    except (OSError, KeyError):
        return None


def check_obs_columns(path: str | os.PathLike, keys: dict[str, str]) -> None:
    """Refuse ``keys`` (``{config key: obs column}``) naming a column the file lacks, in one line; nothing is
    checked where :func:`obs_columns` cannot tell."""
    columns = obs_columns(path)
    if columns is None:
        return
    for what, column in keys.items():
        if column not in columns:
            have = ", ".join(columns) if columns else f"none (a {Path(path).suffix} file carries no cell annotations)"
            raise CapeInputError(f"{what}={column}: no such column in {path}; its cell annotation columns: {have}")


def _read_by_suffix(p: Path, suffix: str) -> ad.AnnData:
    with warnings.catch_warnings():
        # anndata's "call .var_names_make_unique": validate_adata does that, and says so in its own warning
        warnings.filterwarnings("ignore", message="(Variable|Observation) names are not unique")
        return _read_any(p, suffix)


def _read_any(p: Path, suffix: str) -> ad.AnnData:
    if suffix == ".h5ad":
        return ad.read_h5ad(p)
    if suffix == ".h5":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # duplicated gene symbols are handled by validate_adata
            return sc.read_10x_h5(p)
    if suffix == ".loom":
        return _read_loom(p)
    if suffix == ".zarr":
        return ad.read_zarr(p)
    return _read_csv(p)


#: Row (gene) and column (cell) attributes that name a loom file's genes and cells, in order of preference:
#: loompy's and velocyto's ``Gene`` / ``CellID``, then what ``AnnData.write_loom`` writes.
LOOM_GENE_NAMES = ("Gene", "var_names", "Accession", "gene_ids")
LOOM_CELL_NAMES = ("CellID", "obs_names")


def _read_loom(p: Path) -> ad.AnnData:
    with h5py.File(p, "r") as f:
        genes = list(f["row_attrs"].keys()) if "row_attrs" in f else []
        cells = list(f["col_attrs"].keys()) if "col_attrs" in f else []
    gene_key = next((k for k in LOOM_GENE_NAMES if k in genes), None)
    if gene_key is None:
        raise CapeInputError(f"{p}: no gene names in the loom file (row attributes {', '.join(LOOM_GENE_NAMES)}); "
                             f"it has {', '.join(genes) or 'none'}")
    cell_key = next((k for k in LOOM_CELL_NAMES if k in cells), LOOM_CELL_NAMES[0])
    with warnings.catch_warnings():
        # "Transforming to str index" when cells are unnamed (numbered instead); duplicated names: validate_adata
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        read_loom = getattr(getattr(ad, "io", None), "read_loom", None) or ad.read_loom  # anndata.io from 0.11
        return read_loom(p, sparse=True, var_names=gene_key, obs_names=cell_key)


#: Rows of a CSV parsed at once: a 10x-shaped CSV (30,000-odd genes) is never held as one dense frame.
CSV_CHUNK_ROWS = 1000
#: A CSV matrix with at most this share of non-zeros is kept sparse (CSR), as raw UMI counts are.
CSV_SPARSE_MAX_DENSITY = 0.5


def _read_csv(p: Path) -> ad.AnnData:
    """Cells are rows, genes are columns, the first column holds cell names. Read in chunks of
    :data:`CSV_CHUNK_ROWS` cells, each stored sparse, so memory follows the non-zeros; a mostly non-zero matrix
    (density above :data:`CSV_SPARSE_MAX_DENSITY`) is returned dense float32."""

    blocks, names, columns = [], [], None
    for frame in pd.read_csv(p, index_col=0, chunksize=CSV_CHUNK_ROWS):
        if frame.shape[1] == 0:
            raise CapeInputError(f"{p} has no gene columns (expected cells × genes with a header row)")
        non_numeric = [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])]
        if non_numeric:
            raise CapeInputError(f"{p}: column {non_numeric[0]!r} is not numeric (expected cells × genes)")
        columns = frame.columns if columns is None else columns
        blocks.append(sp.csr_matrix(frame.to_numpy(dtype=np.float32)))
        names.append(frame.index.astype(str))
    if columns is None:  # a header and no rows
        frame = pd.read_csv(p, index_col=0)
        if frame.shape[1] == 0:
            raise CapeInputError(f"{p} has no gene columns (expected cells × genes with a header row)")
        blocks, names, columns = [sp.csr_matrix((0, frame.shape[1]), dtype=np.float32)], [frame.index], frame.columns
    X = sp.vstack(blocks, format="csr")
    if X.nnz > CSV_SPARSE_MAX_DENSITY * X.shape[0] * X.shape[1]:
        X = X.toarray()
    adata = ad.AnnData(X)
    adata.obs_names = pd.Index(np.concatenate([np.asarray(n) for n in names])).astype(str)
    adata.var_names = columns.astype(str)
    return adata


#: Above this maximum a non-integer matrix is not log-scale expression (log1p(1e4-normalised counts) ≤ ~9.3;
#: a generous margin covers other target sums).
LOG_SCALE_MAX = 30.0


def _is_integer(values: np.ndarray) -> bool:
    """Whether every value is a whole number (judged on at most the first million, which is enough)."""
    sample = values[: 1_000_000]
    with np.errstate(invalid="ignore"):  # NaN is not whole; the callers report it
        return bool(np.all(np.equal(np.mod(sample, 1), 0)))


def detect_scale(adata: ad.AnnData) -> str:
    """Classify ``adata.X``: ``"counts"`` (non-negative integers), ``"log"`` (log-normalised already, from
    scanpy's ``uns["log1p"]`` marker or non-integer values ≤ :data:`LOG_SCALE_MAX`) or ``"continuous"`` (other
    non-negative values, e.g. TPM or intensities).

    A ``uns["log1p"]`` marker beside whole numbers above 1 is stale: counts put back into ``X`` after scanpy's
    ``log1p`` (``adata.X = adata.layers["counts"]``) keep the marker. Such a matrix is classified as counts, with
    a warning.

    Parameters
    ----------
    adata
        Cells × genes.

    Returns
    -------
    ``"counts"``, ``"log"`` or ``"continuous"``.

    Reads
    -----
    ``X`` and ``uns["log1p"]``.

    Writes
    ------
    Nothing: ``adata`` is left unchanged.
    """
    x = adata.X
    values = x.data if sp.issparse(x) else np.asarray(x).ravel()
    integer = _is_integer(values)
    if "log1p" in adata.uns:
        # log1p(y) is a whole number only where y = e^k − 1, so whole numbers above 1 are counts
        if not (integer and values.size and float(values.max()) > 1):
            return "log"
        warnings.warn(f"uns['log1p'] is set but X holds whole numbers up to {float(values.max()):.4g}: "
                      "treating X as raw counts (delete uns['log1p'] to silence this)", UserWarning, stacklevel=2)
        return "counts"
    if values.size == 0 or integer:
        return "counts"
    return "log" if float(values.max()) <= LOG_SCALE_MAX else "continuous"


def _looks_scaled(adata: ad.AnnData) -> bool:
    return "scale" in adata.uns or ("pca" in adata.uns and adata.raw is not None)


def validate_adata(adata: ad.AnnData, *, source: str = "AnnData", expect_counts: bool | None = None) -> ad.AnnData:
    """Check an AnnData in place: at least :data:`MIN_CELLS` cells and one gene, finite ``X``, non-negative where
    expected, unique gene names.

    Duplicated gene names are made unique (``var_names_make_unique``) with a warning; everything else raises
    :class:`cape.CapeInputError` with a one-line message that names the problem.
    """
    if adata.n_obs == 0:
        raise CapeInputError(f"{source} has 0 cells")
    if adata.n_vars == 0:
        raise CapeInputError(f"{source} has 0 genes")
    if adata.n_obs < MIN_CELLS:
        raise CapeInputError(f"{source} has {adata.n_obs} cell; cape needs at least {MIN_CELLS} cells")
    x = adata.X
    if x is None:
        raise CapeInputError(f"{source} has no expression matrix X")
    values = x.data if sp.issparse(x) else np.asarray(x)
    if not np.issubdtype(values.dtype, np.number):
        raise CapeInputError(f"{source}: X has non-numeric dtype {values.dtype}")
    if values.size:
        finite = np.isfinite(values)
        if not finite.all():
            bad = np.unravel_index(int(np.argmin(finite)), values.shape) if not sp.issparse(x) else None
            kind = "NaN" if np.isnan(values).any() else "inf"
            where = ""
            if bad is not None and values.ndim == 2:
                where = f" (first at cell {adata.obs_names[bad[0]]!r}, gene {adata.var_names[bad[1]]!r})"
            raise CapeInputError(f"{source}: X contains {kind} values{where}")
        if expect_counts is None:
            expect_counts = not _looks_scaled(adata)
        if expect_counts and values.min() < 0:
            raise CapeInputError(
                f"{source}: X has negative values (min {values.min():.4g}) where counts or normalised "
                "expression are expected"
            )
    if not adata.var_names.is_unique:
        dup = adata.var_names[adata.var_names.duplicated()].unique()
        example = ", ".join(map(str, dup[:5]))
        warnings.warn(
            f"{source}: {len(dup)} duplicated gene names ({example}{', …' if len(dup) > 5 else ''}); made unique",
            UserWarning,
            stacklevel=2,
        )
        adata.var_names_make_unique()
    if not adata.obs_names.is_unique:
        adata.obs_names_make_unique()
    return adata
