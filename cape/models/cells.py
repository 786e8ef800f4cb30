"""From an AnnData to the cell datasets of a :class:`~cape.models.CellTransformer`: where the expression is, which
genes form the vocabulary, and how the AnnData's genes map onto it."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from .._errors import CapeInputError
from .tokenize import AUTO, CellDataset, GeneVocab, TokenizerConfig, covering_max_len, truncation_summary

logger = logging.getLogger("cape")

#: ``vocabulary=`` choices: the genes of Steps I–III (``var["cape_used"]``) or every gene of the AnnData.
VOCABULARIES = ("used", "all")


@dataclass(frozen=True)
class InputConfig:
    """Which values of an AnnData a :class:`~cape.models.CellTransformer` reads.

    Attributes
    ----------
    layer, use_raw
        Where the expression is: ``adata.layers[layer]``, ``adata.raw.X`` or ``adata.X`` (default).
    vocabulary
        Which genes form the vocabulary (and are tokenised): ``"used"`` (default) the genes of Steps I–III,
        ``var["cape_used"]`` (e.g. the highly variable genes), so that embeddings, positions and every
        genes × genes diagnostic scale with the genes in play, not with the 30,000-odd genes of a raw matrix;
        ``"all"`` every gene of the expression matrix. Without ``var["cape_used"]``, ``"used"`` falls back to all
        genes (with a log line). Other genes of the AnnData are left out of the cells' tokens. (A model imported
        with :meth:`~cape.models.CellTransformer.from_scgpt` has the checkpoint's vocabulary.)
    """

    layer: str | None = None
    use_raw: bool = False
    vocabulary: str = "used"


class CellData:
    """Mixin of :class:`~cape.models.CellTransformer`: reads cells off an AnnData for the model's vocabulary.

    Uses the model's ``layer``, ``use_raw``, ``vocabulary`` (:class:`InputConfig`), ``vocab``, ``tokenizer``,
    ``seed`` and ``strict_genes`` (False for imported vocabularies); sets ``truncation``
    (:func:`~cape.models.tokenize.truncation_summary` of the last cells tokenised).
    """

    layer: str | None
    use_raw: bool
    vocabulary: str
    vocab: GeneVocab
    tokenizer: TokenizerConfig
    seed: int
    strict_genes: bool
    truncation: dict[str, float] | None

    def _vocabulary_genes(self, adata, var_names: pd.Index) -> pd.Index:
        """The genes of the vocabulary, in the AnnData's order (see ``vocabulary`` of CellTransformer)."""
        if self.vocabulary == "all":
            return var_names
        if "cape_used" not in adata.var:
            logger.info("var['cape_used'] not found: the vocabulary is all %d genes", len(var_names))
            return var_names
        used = adata.var_names[np.asarray(adata.var["cape_used"], dtype=bool)]
        genes = var_names[var_names.isin(used)]
        if len(genes) == 0:
            raise CapeInputError("var['cape_used'] marks none of the expression matrix's genes; run cape preprocess "
                                 "or use vocabulary='all'")
        logger.info("vocabulary: the %d genes of var['cape_used'] (of %d; vocabulary='all' keeps every gene)",
                    len(genes), len(var_names))
        return genes

    def _position_source(self, adata):
        # Positions live on the genes of the AnnData the expression comes from (.raw has its own var).
        return adata.raw.to_adata() if self.use_raw else adata

    def expression(self, adata) -> tuple[Any, pd.Index]:
        """The expression matrix the model reads from ``adata`` (``layer``, ``.raw`` or ``X``; checked
        non-negative) and its gene names."""
        if self.use_raw:
            if adata.raw is None:
                raise CapeInputError("use_raw=True but the AnnData has no .raw")
            X, names = adata.raw.X, adata.raw.var_names
        elif self.layer is not None:
            if self.layer not in adata.layers:
                raise CapeInputError(f"layer '{self.layer}' not in adata.layers ({', '.join(adata.layers) or 'none'})")
            X, names = adata.layers[self.layer], adata.var_names
        else:
            X, names = adata.X, adata.var_names
        if X is None:
            raise CapeInputError("the AnnData has no expression matrix")
        data = X.data if sp.issparse(X) else np.asarray(X)
        if data.size and np.nanmin(data) < 0:
            raise CapeInputError(
                "expression has negative values (scaled data?): give log-normalised counts via layer= or use_raw=True"
            )
        return X, names

    def _gene_ids(self, var_names) -> np.ndarray:
        n_unknown, n_absent = self.vocab.difference(var_names)
        if not self.strict_genes:
            # Imported foundation-model vocabularies: keep the AnnData's genes that the vocabulary knows.
            if n_unknown == len(var_names):
                raise CapeInputError("none of the AnnData's genes is in the model's gene vocabulary")
            if n_unknown:
                logger.info("%d of %d genes are not in the model's vocabulary and are left out",
                            n_unknown, len(var_names))
            return self.vocab.lookup(var_names)
        if self.vocabulary == "used":
            # A vocabulary of the used genes is a subset of the AnnData's genes: the others are not tokenised.
            if n_absent:
                raise CapeInputError(
                    f"gene vocabulary mismatch: {n_absent} of the model's {len(self.vocab.genes)} genes (its "
                    "vocabulary: the genes of var['cape_used']) are missing from the AnnData"
                )
            return self.vocab.lookup(var_names)
        if n_unknown or n_absent:
            raise CapeInputError(
                f"gene vocabulary mismatch: {n_unknown} of the AnnData's {len(var_names)} genes are not in the "
                f"model's vocabulary and {n_absent} of the model's {len(self.vocab.genes)} genes are missing "
                "from the AnnData"
            )
        return self.vocab.lookup(var_names)

    def _resolve_max_len(self, adata) -> None:
        """``max_len="auto"`` → the length that covers every gene token of ``adata``'s cells (capped, see
        :func:`~cape.models.tokenize.covering_max_len`)."""
        if self.tokenizer.max_len != AUTO:
            return
        counts = self._dataset(adata, check_length=False).tokens_per_cell()
        self.tokenizer = dataclasses.replace(self.tokenizer, max_len=covering_max_len(counts))
        logger.info("max_len auto: %d tokens per cell (the most gene tokens of a cell, %d, plus <cls>)",
                    self.tokenizer.max_len, int(counts.max()) if counts.size else 0)

    def _dataset(self, adata, *, labels: np.ndarray | None = None, mask_ratio: float = 0.0,
                 cell_targets: bool = False, check_length: bool = True) -> CellDataset:
        X, names = self.expression(adata)
        ids = self._gene_ids(names)
        known = np.flatnonzero(ids >= 0)
        if known.size < ids.size:
            # Keep only the vocabulary's columns: cells are tokenised over those genes alone, and a sparse matrix
            # stays sparse (never a dense cells × all-genes array).
            X, ids = X[:, known], ids[known]
        data = CellDataset(X, ids, self.vocab, self.tokenizer, labels=labels, mask_ratio=mask_ratio, seed=self.seed,
                           cell_targets=cell_targets)
        if check_length:
            self._report_truncation(truncation_summary(data.tokens_per_cell(), self.tokenizer.max_len))
        return data

    def _report_truncation(self, summary: dict[str, float]) -> None:
        """Warn (once per distinct outcome) when ``max_len`` drops gene tokens, and keep the summary."""
        previous, self.truncation = self.truncation, summary
        if summary["n_cells_truncated"] and summary != previous:
            logger.warning(
                "max_len %d truncates %d of %d cells: they lose %.1f of their gene tokens on average (at most %d), "
                "drawn at random; max_len %d (or 'auto') keeps them all", summary["max_len"],
                summary["n_cells_truncated"], summary["n_cells"], summary["mean_genes_lost"],
                summary["max_genes_lost"], summary["covering_max_len"])
