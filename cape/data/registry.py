"""Named datasets: ``available()``, ``load(name)``, ``fetch(name)``."""

from __future__ import annotations

from pathlib import Path

import anndata as ad

from . import download
from .loaders import build
from .manifest import get_manifest, manifests


def available() -> list[str]:
    """Names of the datasets described in ``data_manifests/``."""
    return list(manifests())


def fetch(name: str) -> dict[str, Path]:
    """Download (or locate) and verify the files of dataset ``name``; return ``{role: path}``."""
    return download.fetch(get_manifest(name))


def load(name: str) -> ad.AnnData:
    """Load a named dataset as AnnData.

    The files are fetched into the cache and checksum-verified first (see :func:`fetch`). The manifest's record
    (source, checksums, license, citation, keys) is stored in ``uns["cape"]["dataset"]``.

    Examples
    --------
    >>> import cape
    >>> adata = cape.data.load("pbmc68k_reduced")
    >>> adata.obs["bulk_labels"].nunique()
    10
    """
    manifest = get_manifest(name)
    adata = build(download.fetch(manifest), manifest)
    adata.uns.setdefault("cape", {})["dataset"] = manifest.as_record()
    return adata
