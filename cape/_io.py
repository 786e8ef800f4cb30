"""Atomic output: write to a temporary file beside the target, then rename, so no partial output is left (AnnData,
JSON records, text, figures)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anndata as ad

from ._errors import CapeInputError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; on success it replaces ``path``, on error it is removed."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as error:  # a read-only or missing place is the user's to fix: one line, not a traceback
        raise CapeInputError(f"cannot write {target}: {error.strerror or error}") from None
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp creates 0600 files; give the result the permissions a plain open() would.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_h5ad(adata: ad.AnnData, path: str | os.PathLike) -> Path:
    """Write ``adata`` to ``path`` atomically (compressed h5ad)."""
    with atomic_path(path) as tmp:
        adata.write_h5ad(tmp, compression="gzip")
    return Path(path)


def write_json(records: list[dict], path: str | os.PathLike) -> Path:
    """Write records as a JSON list, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(records, indent=1, default=_jsonable))
    return Path(path)


def write_text(text: str, path: str | os.PathLike) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def save_figure(fig, path: str | os.PathLike, dpi: int = 150) -> Path:
    """Save a matplotlib figure atomically (png by the target's suffix)."""
    target = Path(path)
    with atomic_path(target) as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format=target.suffix.lstrip(".") or "png")
    return target


def _jsonable(obj):
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)
