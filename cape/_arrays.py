"""Array helpers shared by every layer."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch


def dense(x, dtype=np.float64) -> np.ndarray:
    """``x`` (a NumPy array, a SciPy sparse matrix or array-like) as a dense NumPy array of ``dtype`` (``None``:
    keep the input's dtype)."""
    return np.asarray(x.toarray() if sp.issparse(x) else x, dtype=dtype)


def float64_on(x, device: torch.device | None):
    """``x`` as float64 where its linear algebra is to run: a dense NumPy array when ``device`` is ``None``, else a
    torch tensor on ``device``. Code written with operators, ``.T``, ``.sum(axis=…)`` and ``namespace(device)``'s
    ``linalg`` then runs unchanged on either."""
    x = dense(x)
    return x if device is None else torch.from_numpy(x).to(device)


def namespace(device: torch.device | None):
    """The module whose functions act on :func:`float64_on`'s arrays: ``numpy`` or ``torch``."""
    return np if device is None else torch


def to_numpy(x) -> np.ndarray:
    """A NumPy array of ``x``, a NumPy array (returned as is) or a torch tensor on any device."""
    return x if isinstance(x, np.ndarray) else x.detach().cpu().numpy()


def add_to_diagonal(a, value: float) -> None:
    """Add ``value`` to the diagonal of the square ``a`` in place (a NumPy array or a torch tensor)."""
    if isinstance(a, np.ndarray):
        a[np.diag_indices_from(a)] += value
    else:
        a.diagonal().add_(value)


#: A column whose standard deviation is at most this fraction of its largest magnitude is constant: NumPy's
#: two-pass standard deviation of a constant column is round-off (~1e-17 of its value), not zero, and dividing by
#: it would turn the round-off into z-scores of order one.
CONSTANT_COLUMN_RTOL = 1e-9


def zscore_columns(x) -> tuple[np.ndarray, np.ndarray]:
    """Each column of ``x`` centred and divided by its standard deviation, in float64.

    Returns ``(z, constant)``: constant columns (standard deviation within :data:`CONSTANT_COLUMN_RTOL` of the
    column's largest magnitude, zero included) are exactly 0 in ``z`` and flagged in the boolean ``constant``.
    """
    x = dense(x)
    if x.ndim != 2:
        raise ValueError(f"zscore_columns expects a 2-D array, got shape {x.shape}")
    if x.shape[0] == 0:
        return x.copy(), np.ones(x.shape[1], dtype=bool)
    sd = x.std(axis=0)
    constant = sd <= CONSTANT_COLUMN_RTOL * np.abs(x).max(axis=0)
    z = (x - x.mean(axis=0)) / np.where(constant, 1.0, sd)
    z[:, constant] = 0.0
    return z, constant


#: From this share of non-zero entries on, a sparse matrix's cross-products are summed over dense blocks of rows
#: (multithreaded BLAS) rather than taken as a sparse product, whose work and index arrays grow with the square of
#: the density (at 70 % non-zero, as deep counts are, the sparse product is over 30 times slower).
DENSE_GRAM_DENSITY = 0.05
#: Rows per dense block of :func:`cross_products`.
GRAM_BLOCK_ROWS = 2048


def cross_products(x) -> np.ndarray:
    """xᵀx in float64 for a dense array or a sparse matrix (dense blocks of rows where it is not very sparse, never
    the whole matrix at once)."""
    if not sp.issparse(x):
        x = np.asarray(x, dtype=np.float64)
        return x.T @ x
    x = sp.csr_matrix(x, dtype=np.float64)
    if x.nnz < DENSE_GRAM_DENSITY * x.shape[0] * x.shape[1]:
        return (x.T @ x).toarray()
    gram = np.zeros((x.shape[1], x.shape[1]))
    for start in range(0, x.shape[0], GRAM_BLOCK_ROWS):
        block = x[start:start + GRAM_BLOCK_ROWS].toarray()
        gram += block.T @ block
    return gram


def _constant_columns(x) -> np.ndarray:
    """Which columns of ``x`` (dense or sparse) hold one value, found exactly: the one-pass variance of a constant
    column is round-off of its mean's square, whose square root is far from zero."""
    low, high = x.min(axis=0), x.max(axis=0)
    if sp.issparse(low):
        low, high = low.toarray(), high.toarray()
    return np.asarray(low).ravel() == np.asarray(high).ravel()


def correlation_matrix(x) -> np.ndarray:
    """The columns' Pearson correlation matrix in float64, from a dense array or a sparse matrix (never densified
    whole: :func:`cross_products`); a constant column's row and column are 0."""
    n = x.shape[0]
    x = sp.csr_matrix(x, dtype=np.float64) if sp.issparse(x) else np.asarray(x, dtype=np.float64)
    mean = np.asarray(x.mean(axis=0)).ravel()
    covariance = cross_products(x) / n - np.outer(mean, mean)
    std = np.where(_constant_columns(x), 0.0, np.sqrt(np.clip(np.diag(covariance), 0.0, None)))
    safe = np.where(std > 0, std, 1.0)
    correlation = covariance / safe[:, None] / safe[None, :]
    correlation[std == 0] = 0.0
    correlation[:, std == 0] = 0.0
    return correlation
