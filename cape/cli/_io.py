"""Reading a command's input and checking its output path: shared by every stage command."""

from __future__ import annotations

from pathlib import Path


def read_input(spec: str, *, expect_counts: bool | None = None):
    """Read ``spec``: a file path (validated by :func:`cape.data.read`), or ``dataset:NAME`` for a named dataset."""
    from .. import data

    if spec.startswith("dataset:"):
        return data.load(spec.split(":", 1)[1])
    return data.read(spec, expect_counts=expect_counts)


def check_output(path: str) -> Path:
    """The output path, which must be an ``.h5ad`` file (written atomically by the command)."""
    from .._errors import CapeInputError

    out = Path(path)
    if out.suffix != ".h5ad":
        raise CapeInputError(f"--output must end in .h5ad, got {path}")
    return out
