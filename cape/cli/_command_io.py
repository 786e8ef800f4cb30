"""Reading a command's input and checking its output paths: shared by every stage command."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .. import data
from .._errors import CapeInputError
from ..models.tokenize import AUTO


def read_input(spec: str, *, expect_counts: bool | None = None, transpose: bool = False):
    """Read ``spec``: a file path (validated by :func:`cape.data.read`), or ``dataset:NAME`` for a named dataset;
    ``transpose`` swaps rows and columns of a genes × cells file."""

    if spec.startswith("dataset:"):
        if transpose:
            raise CapeInputError("--transpose applies to a genes × cells file; named datasets are cells × genes")
        return data.load(spec.split(":", 1)[1])
    return data.read(spec, expect_counts=expect_counts, transpose=transpose)


def same_path(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name the same file or folder, after resolving symbolic links and relative parts."""
    pa, pb = Path(a), Path(b)
    if pa.exists() and pb.exists():
        return os.path.samefile(pa, pb)  # also catches hard links
    return pa.resolve() == pb.resolve()


def check_output(path: str, *inputs: str | None, suffix: str | None = ".h5ad", option: str = "--output") -> Path:
    """The output path of a command, refused when it lacks ``suffix`` or is one of the command's ``inputs``.

    Outputs are written atomically over the target, so an output equal to an input would silently replace the
    user's file; ``dataset:NAME`` inputs and ``None`` are skipped.
    """

    out = Path(path)
    if suffix is not None and out.suffix != suffix:
        raise CapeInputError(f"{option} must end in {suffix}, got {path}")
    for spec in inputs:
        if spec is None or str(spec).startswith("dataset:"):
            continue
        if same_path(out, spec):
            raise CapeInputError(f"{option} {path} is the input file {spec}; write to a new file so the input is kept")
    check_writable(out, option)
    return out


def check_writable(path: str | os.PathLike, option: str = "--output") -> None:
    """Refuse, before any work is done, an output whose folder cannot be made or written: the nearest existing
    folder above it must be a writable folder."""

    folder = Path(path).absolute().parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise CapeInputError(f"{option} {path}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CapeInputError(f"{option} {path}: cannot write in {folder} (permission denied or read-only)")


def positive_int(value: str, what: str = "a positive integer") -> int:
    """argparse type: an integer ≥ 1; ``what`` names what was expected in the one-line error."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}")
    return n


def max_len_value(value: str) -> int | str:
    """``--max-len``: ``auto`` (cover every expressed gene) or a whole number of tokens."""
    if value == AUTO:
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a whole number, got {value!r}") from None


def tau_value(value: str) -> float | str:
    """``--tau``: Step I's edge threshold, a number or the rule ``budget`` / ``auto``."""
    # A number out of range is left to cape.tl.causal_graph, which refuses it in one line (exit 2).
    if value.strip().lower() in ("auto", "budget"):
        return value.strip().lower()
    try:
        return float(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"tau must be a number in [0, 1), 'budget' or 'auto', got {value!r}") from err
