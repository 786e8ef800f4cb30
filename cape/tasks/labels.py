"""Labels of cells: the dataset manifest's keys, label-key resolution and checked labels, shared by every task."""

from __future__ import annotations

import logging
import warnings

import anndata as ad
import pandas as pd

from .._errors import CapeInputError

logger = logging.getLogger("cape")

#: ``obs`` column with the role of each cell in annotation: ``fine_tune``, ``test`` or ``unused`` (unlabelled, or a
#: class too small to split).
SPLIT_KEY = "cape_split"


def manifest_key(adata: ad.AnnData, role: str) -> str | None:
    """The dataset manifest's obs key for ``role`` (``"labels"``, ``"batch"``) when the data came from a named
    dataset (``uns["cape"]["dataset"]["keys"]``), else ``None``."""
    return adata.uns.get("cape", {}).get("dataset", {}).get("keys", {}).get(role)


def resolve_label_key(adata: ad.AnnData, label_key: str | None) -> str | None:
    """``"auto"``: the dataset manifest's label key, else none; ``None``: no labels; anything else must be an
    ``obs`` column."""
    if label_key == "auto":
        label_key = manifest_key(adata, "labels")
        if label_key is None:
            logger.info("no label key given and none known for this data: annotation and clustering are skipped")
            return None
    if label_key is not None and label_key not in adata.obs:
        raise CapeInputError(f"label key obs[{label_key!r}] not found; obs columns: "
                             f"{', '.join(map(str, adata.obs.columns)) or '(none)'}")
    return label_key


def checked_labels(adata: ad.AnnData, label_key: str, *, min_cells: int = 2) -> pd.Series:
    """Labels from ``obs[label_key]`` as strings, with classes of fewer than ``min_cells`` cells removed (warning).

    Cells without a label (NaN) are left out with a warning. Raises :class:`cape.CapeInputError` when the key is
    missing, every label is, or fewer than 2 classes remain. The returned Series is indexed by obs name and holds
    only the kept cells.
    """
    if label_key not in adata.obs:
        known = ", ".join(map(str, adata.obs.columns)) or "(none)"
        raise CapeInputError(f"label key obs[{label_key!r}] not found; obs columns: {known}")
    labels = adata.obs[label_key]
    missing = labels.isna().to_numpy()
    if missing.all():
        raise CapeInputError(f"obs[{label_key!r}] has no labels: all {missing.size} are missing")
    if missing.any():
        # unlabelled cells are common (unannotated clusters); they are scored as they are trained: not at all
        warnings.warn(f"obs[{label_key!r}]: {int(missing.sum())} cell(s) without a label left out",
                      UserWarning, stacklevel=2)
        labels = labels[~missing]
    labels = labels.astype(str)
    counts = labels.value_counts()
    small = sorted(counts.index[counts < min_cells])
    if small:
        msg = f"obs[{label_key!r}]: {len(small)} class(es) with fewer than {min_cells} cells excluded: " + \
            ", ".join(small)
        warnings.warn(msg, UserWarning, stacklevel=2)
        labels = labels[~labels.isin(small)]
    if labels.nunique() < 2:
        raise CapeInputError(f"obs[{label_key!r}] has {labels.nunique()} class(es) with at least {min_cells} cells; "
                             "annotation and clustering need at least 2")
    return labels
