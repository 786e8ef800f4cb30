"""Dataset manifests: one YAML file per dataset in ``data_manifests/``, validated against a JSON schema."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .._errors import CapeInputError

_SCHEMA_PATH = Path(__file__).with_name("manifest.schema.yaml")


def manifest_dir() -> Path:
    """Folder holding the manifests: ``$CAPE_MANIFEST_DIR``, else the copy inside an installed wheel, else the
    repository's ``data_manifests/``."""
    env = os.environ.get("CAPE_MANIFEST_DIR")
    if env:
        return Path(env)
    package = Path(__file__).resolve().parent.parent
    packaged = package / "_manifests"
    return packaged if packaged.is_dir() else package.parent / "data_manifests"


@functools.cache
def _schema() -> dict:
    return yaml.safe_load(_SCHEMA_PATH.read_text())


@dataclass(frozen=True)
class Manifest:
    """A validated dataset manifest (see ``cape/data/manifest.schema.yaml``)."""

    name: str
    description: str
    source: dict
    files: list[dict]
    loader: str
    license: str
    citation: str
    keys: dict = field(default_factory=dict)
    shape: dict = field(default_factory=dict)
    path: Path | None = None

    def as_record(self) -> dict[str, Any]:
        """A plain dict for ``uns`` (no paths, no None values: h5ad cannot store None)."""
        return {
            "name": self.name,
            "source": {k: str(v) for k, v in self.source.items()},
            "sha256": {f["role"]: f["sha256"] or "" for f in self.files},
            "license": self.license,
            "citation": self.citation,
            "keys": {k: v for k, v in self.keys.items() if v is not None},
        }


def validate_manifest(data: Any, *, where: str) -> Manifest:
    """Validate a parsed manifest; raise :class:`cape.CapeInputError` naming the offending key."""
    if not isinstance(data, dict):
        raise CapeInputError(f"{where}: a manifest must be a YAML mapping")
    errors = sorted(jsonschema.Draft202012Validator(_schema()).iter_errors(data), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        key = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        raise CapeInputError(f"{where}: invalid manifest at {key}: {err.message}")
    stype = data["source"]["type"]
    for f in data["files"]:
        needed = "url" if stype == "url" else "path"
        if needed not in f:
            raise CapeInputError(f"{where}: file {f['role']!r} needs '{needed}' for a {stype} source")
    return Manifest(**data)


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Read and validate one manifest file; its ``name`` must match the file's stem."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise CapeInputError(f"cannot read manifest {p}: {err}") from err
    manifest = validate_manifest(data, where=str(p))
    if manifest.name != p.stem:
        raise CapeInputError(f"{p}: manifest name {manifest.name!r} does not match its file name")
    return Manifest(**{**manifest.__dict__, "path": p})


def manifests() -> dict[str, Manifest]:
    """All manifests in :func:`manifest_dir`, by name."""
    folder = manifest_dir()
    if not folder.is_dir():
        raise CapeInputError(f"manifest folder not found: {folder} (set CAPE_MANIFEST_DIR)")
    return {p.stem: read_manifest(p) for p in sorted(folder.glob("*.yaml"))}


def get_manifest(name: str) -> Manifest:
    """The manifest called ``name``; an unknown name lists the known ones."""
    known = manifests()
    if name not in known:
        raise CapeInputError(f"unknown dataset {name!r}; known datasets: {', '.join(known) or '(none)'}")
    return known[name]
