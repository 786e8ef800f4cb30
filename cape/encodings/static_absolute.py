"""``static_absolute``: a frozen per-gene embedding added to the input (scBERT's gene2vec role).

The vectors come from, in this order: ``GenePositions.vectors``; a gene2vec-format text file
(``gene2vec_path=``
with ``gene_names=`` giving the vocabulary's gene per index); or co-expression — build them with
:func:`co_expression_vectors` (truncated SVD of the gene×gene Pearson correlation of an expression matrix) and
pass them as positions. Vectors narrower than d_model are zero-padded; the table is scaled to unit RMS so
that it sits on the token embeddings' scale. Nothing here is trained; tokens without a vector get zero.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.linalg import LinearOperator, eigsh
from sklearn.utils.extmath import randomized_svd
from torch import Tensor

from .._arrays import correlation_matrix
from .._errors import CapeInputError
from .base import EncodingContext, GenePositions, PositionalEncoding

logger = logging.getLogger("cape")

#: Above this many genes :func:`co_expression_vectors` never forms the genes × genes correlation (4,096² float64
#: is 128 MiB; 33,000 genes would be 8.7 GB): it takes the leading eigenvectors of the implicit correlation.
CO_EXPRESSION_DENSE_MAX_GENES = 4096


def read_gene2vec(path: str | os.PathLike, gene_names: Sequence[str]) -> GenePositions:
    """Read a gene2vec / word2vec text file (``GENE v1 v2 …`` per line, optional ``n d`` header line).

    Returns positions aligned to ``gene_names`` (vocabulary order); genes absent from the file have no
    position.
    """
    if not os.path.exists(path):
        raise CapeInputError(f"gene2vec file not found: {path}")
    index = {g: i for i, g in enumerate(gene_names)}
    vectors: np.ndarray | None = None
    found = np.zeros(len(gene_names), dtype=bool)
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            parts = line.split()
            if not parts or (lineno == 1 and len(parts) == 2 and all(p.isdigit() for p in parts)):
                continue
            if vectors is None:
                vectors = np.zeros((len(gene_names), len(parts) - 1), dtype=np.float32)
            if len(parts) - 1 != vectors.shape[1]:
                raise CapeInputError(
                    f"{path}:{lineno}: expected {vectors.shape[1]} numbers after the gene name, "
                    f"got {len(parts) - 1}"
                )
            i = index.get(parts[0])
            if i is not None:
                try:
                    vectors[i] = np.asarray(parts[1:], dtype=np.float32)
                except ValueError as err:
                    raise CapeInputError(f"{path}:{lineno}: not a number ({err})") from None
                found[i] = True
    if vectors is None:
        raise CapeInputError(f"gene2vec file {path} has no vectors")
    if not found.any():
        raise CapeInputError(f"gene2vec file {path} shares no gene with the vocabulary")
    return GenePositions(vectors=torch.from_numpy(vectors), has_position=torch.from_numpy(found),
                         source=str(path))


def co_expression_vectors(X, dim: int = 64, seed: int = 0) -> np.ndarray:
    """Gene vectors from co-expression: rank-``dim`` truncated SVD of the gene×gene Pearson correlation.

    Parameters
    ----------
    X
        (cells, genes) expression matrix (dense or scipy sparse), e.g. log-normalised counts.
    dim
        Vector width (≤ number of genes).
    seed
        Seed of the randomised SVD.

    Returns
    -------
    (genes, dim) float32 array U·√S (genes with similar co-expression profiles get nearby vectors); genes with
    zero variance get zero rows.

    Notes
    -----
    Up to :data:`CO_EXPRESSION_DENSE_MAX_GENES` genes the correlation matrix is formed and factorised by a
    randomised SVD. Above, it is never formed (memory O(cells × genes) as X itself, not genes²): its leading
    eigenvectors are found by Lanczos iteration on the product corr·v = D⁻¹(Xᵀ X D⁻¹v / n − μ μᵀD⁻¹v), with a log
    line. Both give the same vectors up to sign and the randomised SVD's approximation.
    """

    n_cells, n_genes = X.shape
    if dim < 1 or dim > n_genes:
        raise CapeInputError(f"co-expression dim must be in 1..{n_genes} (number of genes), got {dim}")
    if n_cells < 2:
        raise CapeInputError("co-expression vectors need at least 2 cells")
    if n_genes > CO_EXPRESSION_DENSE_MAX_GENES and dim < n_genes - 1:
        return _implicit_co_expression_vectors(X, dim, seed)
    u, s, _ = randomized_svd(correlation_matrix(X), n_components=dim, random_state=seed)
    return (u * np.sqrt(s)).astype(np.float32)


def _implicit_co_expression_vectors(X, dim: int, seed: int) -> np.ndarray:
    """:func:`co_expression_vectors` without the genes × genes matrix (Lanczos on the implicit correlation)."""

    n_cells, n_genes = X.shape
    logger.info("co-expression vectors of %d genes: over %d genes, the correlation is not formed "
                "(Lanczos eigenvectors of the implicit matrix)", n_genes, CO_EXPRESSION_DENSE_MAX_GENES)
    X = sp.csr_matrix(X, dtype=np.float64) if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    mean = np.asarray(X.mean(axis=0)).ravel()
    sq = np.asarray((X.multiply(X) if sp.issparse(X) else X * X).mean(axis=0)).ravel()
    std = np.sqrt(np.clip(sq - mean**2, 0.0, None))
    inv = np.where(std > 0, 1.0 / np.where(std > 0, std, 1.0), 0.0)  # zero-variance genes: zero rows and columns

    def matvec(v: np.ndarray) -> np.ndarray:
        w = inv * np.ravel(v)
        return inv * (np.asarray(X.T @ (X @ w)).ravel() / n_cells - mean * (mean @ w))

    op = LinearOperator((n_genes, n_genes), matvec=matvec, dtype=np.float64)
    v0 = np.random.default_rng(seed).normal(size=n_genes)
    values, vectors = eigsh(op, k=dim, which="LA", v0=v0)
    order = np.argsort(values)[::-1]
    values, vectors = np.clip(values[order], 0.0, None), vectors[:, order]
    return (vectors * np.sqrt(values)).astype(np.float32)


def co_expression_positions(X, gene_ids: Sequence[int], vocab_size: int, dim: int = 64,
                            seed: int = 0) -> GenePositions:
    """:func:`co_expression_vectors` of X's columns placed at their vocabulary indices (others: no position).

    ``gene_ids[c]`` is the vocabulary index of column c of X (cells × genes).
    """
    ids = np.asarray(gene_ids, dtype=np.int64)
    if ids.shape != (X.shape[1],):
        raise CapeInputError(f"gene_ids has {ids.size} entries but X has {X.shape[1]} genes (columns)")
    if ids.min(initial=0) < 0 or ids.max(initial=0) >= vocab_size:
        raise CapeInputError(f"gene_ids must lie in 0..{vocab_size - 1}")
    vectors = np.zeros((vocab_size, dim), dtype=np.float32)
    vectors[ids] = co_expression_vectors(X, dim=dim, seed=seed)
    has = np.zeros(vocab_size, dtype=bool)
    has[ids] = True
    return GenePositions(vectors=torch.from_numpy(vectors), has_position=torch.from_numpy(has),
                         source="co-expression")


class StaticAbsoluteEncoding(PositionalEncoding):
    """x ← x + G[gene_id] with a frozen table G (gene2vec file or co-expression vectors)."""

    name: ClassVar[str] = "static_absolute"
    provides: ClassVar[frozenset[str]] = frozenset({"input"})
    requires: ClassVar[str | None] = "co_expression"

    def __init__(self, *, gene2vec_path: str | None = None, gene_names: Sequence[str] | None = None,
                 **kwargs: Any) -> None:
        if gene2vec_path is not None and kwargs.get("positions") is None:
            if gene_names is None:
                raise CapeInputError("static_absolute: gene2vec_path= also needs gene_names= (vocab order)")
            if len(gene_names) != kwargs.get("vocab_size"):
                raise CapeInputError(
                    f"gene_names has {len(gene_names)} entries but vocab_size is {kwargs.get('vocab_size')}"
                )
            kwargs["positions"] = read_gene2vec(gene2vec_path, gene_names)
        super().__init__(**kwargs)
        vectors = torch.nan_to_num(self._need_vectors().float(), nan=0.0)
        if vectors.shape[1] > self.d_model:
            raise CapeInputError(
                f"static gene vectors are {vectors.shape[1]}-wide but d_model is {self.d_model}; "
                "use vectors of width ≤ d_model"
            )
        vectors = vectors * self.has_position_table[:, None].to(vectors.dtype)
        rows = vectors[self.has_position_table]
        rms = rows.pow(2).mean().sqrt() if rows.numel() else torch.tensor(1.0)
        vectors = vectors / torch.clamp(rms, min=1e-12)
        vectors = torch.nn.functional.pad(vectors, (0, self.d_model - vectors.shape[1]))
        self.register_buffer("table", vectors)  # persistent: saved with the model, never trained

    @classmethod
    def from_expression(cls, X, gene_ids: Sequence[int], *, dim: int | None = None, seed: int = 0,
                        **kwargs: Any) -> StaticAbsoluteEncoding:
        """Build from an expression matrix X (cells × genes; ``gene_ids[c]`` = vocabulary index of column c):
        co-expression vectors of width ``dim`` (default min(d_model, n_genes)) as the frozen table."""
        width = dim or min(int(kwargs["d_model"]), X.shape[1])
        kwargs["positions"] = co_expression_positions(X, gene_ids, int(kwargs["vocab_size"]), width, seed)
        return cls(**kwargs)

    def input_embedding(self, gene_ids: Tensor, ctx: EncodingContext) -> Tensor:
        emb = self.table[gene_ids]
        return emb * ctx.has_position[..., None].to(emb.dtype)
