"""The paper's preprocessing (Supp. F.1.1) with scanpy: QC, library-size normalisation, log1p, HVG selection."""

from __future__ import annotations

import importlib.util
import logging
import numbers
import time
from typing import Any

import anndata as ad
import numpy as np
import scanpy as sc
import scipy.sparse as sp

from .._errors import CapeInputError
from ..causal import MIN_CELLS as STEP1_MIN_CELLS
from ..data.orientation import check_orientation
from ..data.user_files import detect_scale, validate_adata
from ..tasks.perturbation import intervention_labels

logger = logging.getLogger("cape")

#: ``hvg_flavor`` choices: scanpy's three, and analytic Pearson residuals of the raw counts (Lause et al. 2021,
#: ``sc.experimental.pp.highly_variable_genes``), which rank low-expressed genes without the mean bins' extremes.
HVG_FLAVORS = ("seurat", "cell_ranger", "seurat_v3", "pearson_residuals")
#: Highly variable genes used by default, by the notebook API, the command line and the workflow alike: Step I's
#: time grows with the square of the gene count, and the paper's 2,000 stopped a newcomer's first run for minutes.
N_TOP_GENES = 300
#: The flavors that rank the raw counts (``layers["counts"]``), not the log-normalised X.
_COUNT_FLAVORS = ("seurat_v3", "pearson_residuals")
#: preprocess warns when the median used gene is detected in fewer cells than this (and than a tenth of the cells):
#: such a gene's variation is a few cells' values, which Step I's partial-correlation test takes for dependence
#: (docs/benchmarks/count_panel.md, "The budget checked on a permuted copy of its cells").
RARE_GENE_CELLS = 20

def _values(x) -> np.ndarray:
    return x.data if sp.issparse(x) else np.asarray(x).ravel()


def preprocess(
    adata: ad.AnnData,
    min_genes: int = 200,
    target_sum: float = 1e4,
    log1p: bool = True,
    n_top_genes: int | None = N_TOP_GENES,
    *,
    min_cells: int = 0,
    hvg_flavor: str = "seurat",
    interventions: str | None = None,
    copy: bool = False,
) -> ad.AnnData | None:
    """Quality control, normalisation and gene selection as in the CAPE paper (Supp. F.1.1).

    Steps (scanpy under the hood):

    1. QC: drop cells with fewer than ``min_genes`` detected genes (``sc.pp.filter_cells``) and, when
       ``min_cells > 0``, genes detected in fewer cells (``sc.pp.filter_genes``).
    2. Library-size normalisation to ``target_sum`` per cell and ``log1p`` (``sc.pp.normalize_total``,
       ``sc.pp.log1p``). Raw counts are kept in ``layers["counts"]``. Input that is already log-normalised
       (scanpy's ``uns["log1p"]`` marker, or non-integer values no larger than 30) is not normalised again.
    3. Highly variable genes (``sc.pp.highly_variable_genes``, ``n_top_genes``, flavor ``hvg_flavor``) mark
       the genes that take part in the causal graph: ``var["cape_used"]``. With ``n_top_genes`` ≥ the number
       of genes, every gene is used. With ``interventions``, every perturbed gene that varies is used as well,
       highly variable or not, and no ``min_cells`` filter drops it: Step I can then leave its equation out for
       its cells and orient its edges (:func:`cape.tl.causal_graph` with the same ``interventions``). Perturbed
       genes are seldom among the most variable ones.

    Parameters
    ----------
    adata
        Cells × genes, counts or log-normalised expression, non-negative. A matrix whose rows are evidently genes
        (gene IDs as row names beside barcodes as column names, or row totals spread as genes' are) is refused:
        pass ``adata.T`` (:func:`cape.data.orientation.rows_look_like_genes`).
    min_genes
        Minimum number of detected genes per cell (paper: 200). Must not exceed the number of genes.
    target_sum
        Total per cell after normalisation (paper: 10,000).
    log1p
        Apply ``log1p`` after normalisation.
    n_top_genes
        Number of highly variable genes to use (default 300, as ``cape preprocess`` and the workflow; the paper
        used 2,000). ``None``: every gene that varies.
    min_cells
        Minimum number of cells a gene must be detected in (0: keep all genes).
    hvg_flavor
        ``"seurat"`` (log data, default), ``"cell_ranger"``, ``"seurat_v3"`` (needs counts and scikit-misc) or
        ``"pearson_residuals"`` (needs counts: scanpy's analytic Pearson residuals, Lause et al. 2021, which do not
        rank genes within bins of mean expression as ``"seurat"`` does).
    interventions
        ``obs`` column of per-cell perturbation labels in GEARS form (``"ctrl"``, ``"A+ctrl"``, ``"A+B"``), e.g.
        ``"condition"``: the perturbed genes are used besides the highly variable ones. ``None``: HVGs only.
    copy
        Return a modified copy instead of working in place.

    Reads
    -----
    ``X`` (counts or log-normalised expression), ``uns["log1p"]`` when present, ``obs[interventions]``.

    Writes
    ------
    ``X`` (normalised and log1p-transformed, filtered cells and genes removed), ``layers["counts"]`` (when the
    input held counts), ``var["cape_used"]``, ``var["highly_variable"]`` and scanpy's other HVG columns,
    ``obs["n_genes"]``, ``uns["log1p"]``, ``uns["cape"]["preprocess"]``.

    Raises
    ------
    cape.CapeInputError
        Bad parameters, negative values, a genes × cells matrix, or nothing left after QC.

    Returns
    -------
    ``None``, or the copy when ``copy=True``. Sets ``layers["counts"]`` (when the input held counts),
    ``var["cape_used"]``, ``var["highly_variable"]`` and friends, ``obs["n_genes"]``, ``uns["log1p"]`` and
    ``uns["cape"]["preprocess"]`` (parameters, what was done, cells and genes before and after).
    """
    if copy:
        adata = adata.copy()
    _check_params(adata, min_genes, target_sum, n_top_genes, min_cells, hvg_flavor)
    validate_adata(adata, source="input", expect_counts=True)
    check_orientation(adata, source="input")
    targets = _perturbed_genes(adata, interventions)
    record: dict[str, Any] = {
        "params": {"min_genes": min_genes, "target_sum": target_sum, "log1p": log1p, "n_top_genes": n_top_genes,
                   "min_cells": min_cells, "hvg_flavor": hvg_flavor, "interventions": interventions or "none"},
        "n_obs_in": adata.n_obs, "n_vars_in": adata.n_vars,
    }
    start = time.perf_counter()
    _filter(adata, min_genes, min_cells, record["n_obs_in"], targets)
    record["input_scale"], record["normalised"] = _normalise(adata, target_sum, log1p)
    _mark_used_genes(adata, n_top_genes, hvg_flavor)
    _warn_rarely_detected(adata, min_cells)
    if interventions is not None:
        record["targets"] = _use_targets(adata, targets, interventions)
    record.update(n_obs=adata.n_obs, n_vars=adata.n_vars, n_used=int(adata.var["cape_used"].sum()),
                  seconds=time.perf_counter() - start)
    adata.uns.setdefault("cape", {})["preprocess"] = record
    logger.info("preprocessed: %d cells × %d genes, %d genes used for the causal graph",
                adata.n_obs, adata.n_vars, record["n_used"])
    return adata if copy else None


def _perturbed_genes(adata: ad.AnnData, key: str | None) -> list[str]:
    """The genes that ``obs[key]``'s labels perturb (none without a key), checked by
    :func:`~cape.tasks.perturbation.intervention_labels`."""
    if key is None:
        return []
    _, targets = intervention_labels(adata, key)
    return list(dict.fromkeys(g for t in targets.values() for g in t))


def _use_targets(adata: ad.AnnData, genes: list[str], key: str) -> dict[str, int]:
    """Add the perturbed ``genes`` that vary to ``var["cape_used"]`` in place; what was added, for ``uns``."""
    targets = adata.var_names.isin(genes)
    varying = _varying_genes(adata.X)
    used = adata.var["cape_used"].to_numpy(dtype=bool)
    added = targets & varying & ~used
    constant = targets & ~varying
    adata.var["cape_used"] = used | added
    out = {"n_targets": int(targets.sum()), "n_added": int(added.sum()), "n_constant": int(constant.sum())}
    logger.info("interventions=%r: %d perturbed gene(s), %d of them added to the %d highly variable ones; %d constant "
                "after QC and normalisation (left out: nothing to fit)", key, out["n_targets"], out["n_added"],
                int(used.sum()), out["n_constant"])
    return out


def _filter(adata: ad.AnnData, min_genes: int, min_cells: int, n_obs_in: int, keep_genes: list[str]) -> None:
    """QC in place: drop cells with fewer than ``min_genes`` detected genes (sets ``obs["n_genes"]``) and genes
    detected in fewer than ``min_cells`` cells, except ``keep_genes``; too few cells left for Step I is an error
    here, not there."""
    if min_genes > 0:
        n_genes = np.asarray((adata.X > 0).sum(axis=1)).ravel()
        keep = n_genes >= min_genes
        if not keep.any():
            raise CapeInputError(f"no cell has at least min_genes={min_genes} detected genes "
                                 f"(the most is {int(n_genes.max())}); lower min_genes")
        if not keep.all():
            logger.info("QC: removing %d of %d cells with fewer than %d detected genes",
                        int((~keep).sum()), adata.n_obs, min_genes)
        if keep.mean() < 0.5:  # most "cells" nearly empty: often a genes × cells table read the other way round
            logger.warning("QC removed %d of %d cells (fewer than %d detected genes): if the rows of the input are "
                           "genes, transpose it (cape reads cells × genes; cape preprocess --transpose)",
                           int((~keep).sum()), adata.n_obs,
                           min_genes)
        adata._inplace_subset_obs(keep)
        adata.obs["n_genes"] = n_genes[keep]
    if min_cells > 0:
        detected, _ = sc.pp.filter_genes(adata, min_cells=min_cells, inplace=False)
        adata._inplace_subset_var(detected | adata.var_names.isin(keep_genes))
        if adata.n_vars == 0:
            raise CapeInputError(f"no gene is detected in at least min_cells={min_cells} cells")

    if adata.n_obs < STEP1_MIN_CELLS:
        qc = adata.n_obs < n_obs_in
        where = f"{adata.n_obs} cells remain after QC (min_genes={min_genes})" if qc else \
            f"the input has {adata.n_obs} cells"
        raise CapeInputError(f"{where}; cape needs at least {STEP1_MIN_CELLS} cells (Step I's minimum, "
                             "cape.causal.MIN_CELLS)" + ("; lower min_genes" if qc else ""))


def _normalise(adata: ad.AnnData, target_sum: float, log1p: bool) -> tuple[str, bool]:
    """Library-size normalisation and log1p in place unless X is log-scale already (counts kept in
    ``layers["counts"]``): (the input's scale, whether it was normalised)."""
    scale = detect_scale(adata)
    if scale == "log":
        logger.info("input looks log-normalised already; skipping normalisation and log1p")
        return scale, False
    if scale == "counts":
        adata.layers["counts"] = adata.X.copy()
        adata.uns.pop("log1p", None)  # a stale marker (detect_scale warned); sc.pp.log1p sets it anew
    else:
        logger.warning("input is not integer counts (max %.4g); normalising it as expression values, "
                       "no layers['counts'] kept", float(_values(adata.X).max()))
    sc.pp.normalize_total(adata, target_sum=target_sum)
    if log1p:
        sc.pp.log1p(adata)
    return scale, True


def _mark_used_genes(adata: ad.AnnData, n_top_genes: int | None, hvg_flavor: str) -> None:
    """``var["highly_variable"]`` (scanpy's HVG, or every varying gene) and ``var["cape_used"]``, in place."""
    varying = _varying_genes(adata.X)
    n_varying = int(varying.sum())
    if n_varying == 0:
        raise CapeInputError(f"all {adata.n_vars} genes are constant across the {adata.n_obs} cells after "
                             "normalisation: no gene varies, so there is no graph to learn")
    if n_top_genes is None or n_top_genes >= n_varying:
        # HVG ranking needs variation (scanpy fails on constant genes); every gene that varies is used.
        logger.info("n_top_genes=%s ≥ %d genes that vary: using all of them", n_top_genes, n_varying)
        adata.var["highly_variable"] = varying
    else:
        if hvg_flavor in _COUNT_FLAVORS and "counts" not in adata.layers:
            raise CapeInputError(f"hvg_flavor={hvg_flavor!r} needs raw counts, but the input has none")
        layer = "counts" if hvg_flavor in _COUNT_FLAVORS else None
        if hvg_flavor == "pearson_residuals":
            # genes constant in the cells would divide by zero in the residuals; they are never used anyway
            ranked = adata[:, varying].copy()
            sc.experimental.pp.highly_variable_genes(ranked, flavor=hvg_flavor, n_top_genes=n_top_genes,
                                                     layer=layer)
            adata.var["highly_variable"] = False
            adata.var.loc[ranked.var_names, "highly_variable"] = ranked.var["highly_variable"].to_numpy()
        else:
            sc.pp.highly_variable_genes(adata, n_top_genes=n_top_genes, flavor=hvg_flavor, layer=layer)
    adata.var["cape_used"] = adata.var["highly_variable"].astype(bool).to_numpy() & varying
    if not adata.var["cape_used"].any():
        raise CapeInputError(f"every highly variable gene is constant across the {adata.n_obs} cells; "
                             "check the input or raise n_top_genes")


def _warn_rarely_detected(adata: ad.AnnData, min_cells: int) -> None:
    """Warn when the used genes are mostly seen in a handful of cells (:data:`RARE_GENE_CELLS`)."""
    used = adata.var["cape_used"].to_numpy(dtype=bool)
    median = float(np.median(np.asarray((adata.X[:, used] != 0).sum(axis=0)).ravel()))
    if median < min(RARE_GENE_CELLS, 0.1 * adata.n_obs):
        logger.warning("the %d genes used are detected in a median of %g of the %d cells: their variation is a few "
                       "cells' values, which Step I's partial-correlation test takes for dependence; "
                       "preprocess(min_cells=%d) (the workflow's preprocess.min_cells; now %d) picks among genes "
                       "detected in at least that many cells", int(used.sum()), median, adata.n_obs,
                       RARE_GENE_CELLS, min_cells)


def _varying_genes(x) -> np.ndarray:
    """Boolean mask of the genes whose value is not the same in every cell (sparse-friendly, no densifying)."""
    if sp.issparse(x):
        x = sp.csc_matrix(x)
        hi = np.asarray(x.max(axis=0).todense()).ravel()
        lo = np.asarray(x.min(axis=0).todense()).ravel()
    else:
        hi, lo = np.max(x, axis=0), np.min(x, axis=0)
    # relative tolerance: normalisation of proportional cells leaves float rounding differences, not variation
    hi, lo = np.asarray(hi, dtype=np.float64).ravel(), np.asarray(lo, dtype=np.float64).ravel()
    return hi - lo > 1e-6 * np.maximum(1.0, np.abs(hi))


def _check_params(adata: ad.AnnData, min_genes: int, target_sum: float, n_top_genes: int | None, min_cells: int,
                  hvg_flavor: str) -> None:
    if hvg_flavor not in HVG_FLAVORS:
        raise CapeInputError(f"hvg_flavor must be one of {', '.join(HVG_FLAVORS)}, got {hvg_flavor!r}")
    if hvg_flavor == "seurat_v3" and importlib.util.find_spec("skmisc") is None:
        # scanpy imports it only when ranking, after QC and normalisation have changed the data
        raise CapeInputError("hvg_flavor='seurat_v3' needs scikit-misc, which is not installed: "
                             "pip install scikit-misc, or choose another hvg_flavor")
    if min_genes < 0:
        raise CapeInputError(f"min_genes must be ≥ 0, got {min_genes}")
    if min_genes > adata.n_vars:
        raise CapeInputError(f"min_genes={min_genes} exceeds the number of genes ({adata.n_vars}); lower min_genes")
    if not target_sum > 0:
        raise CapeInputError(f"target_sum must be > 0, got {target_sum}")
    if n_top_genes is not None and (isinstance(n_top_genes, bool) or not isinstance(n_top_genes, numbers.Integral)
                                    or n_top_genes < 1):
        raise CapeInputError(f"n_top_genes must be an integer ≥ 1 or None (every varying gene), got {n_top_genes!r}")
    if min_cells < 0:
        raise CapeInputError(f"min_cells must be ≥ 0, got {min_cells}")
