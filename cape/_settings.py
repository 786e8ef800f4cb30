"""Global settings: device, seed, verbosity and progress bars (cf. ``scanpy.settings``)."""

from __future__ import annotations

import logging
import os
import random
import sys
from dataclasses import dataclass, field

import numpy as np

from ._errors import CapeInputError

logger = logging.getLogger("cape")
# Library etiquette: never configure the root logger; stay silent unless the user (or the CLI) adds a handler.
logger.addHandler(logging.NullHandler())

_VERBOSITY_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}


@dataclass
class CapeSettings:
    """Process-wide defaults used when a function is called with ``device="auto"`` / ``seed=None``.

    Attributes
    ----------
    device
        ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    seed
        Default random seed.
    verbosity
        0 errors, 1 warnings, 2 info (default), 3 debug; sets the level of the ``"cape"`` logger.
    progress
        Show progress bars. ``None`` means: only when stderr is a terminal.
    """

    device: str = "auto"
    seed: int = 0
    _verbosity: int = field(default=2, repr=False)
    progress: bool | None = None

    @property
    def verbosity(self) -> int:
        return self._verbosity

    @verbosity.setter
    def verbosity(self, value: int) -> None:
        if value not in _VERBOSITY_LEVELS:
            raise CapeInputError(f"verbosity must be one of {sorted(_VERBOSITY_LEVELS)}, got {value!r}")
        self._verbosity = int(value)
        logger.setLevel(_VERBOSITY_LEVELS[self._verbosity])

    def show_progress(self) -> bool:
        """Whether progress bars should be drawn now."""
        if self.progress is not None:
            return bool(self.progress)
        if os.environ.get("CI"):
            return False
        return sys.stderr.isatty()


settings = CapeSettings()
logger.setLevel(_VERBOSITY_LEVELS[settings.verbosity])


def resolve_device(device: str | None = "auto"):
    """Turn ``"auto"``/``None``/a device string into a :class:`torch.device`.

    ``"auto"`` picks CUDA when available, else CPU. Asking for CUDA on a machine without it is a user error.
    """
    import torch

    if device is None or device == "auto":
        device = settings.device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise CapeInputError(f"unknown device {device!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CapeInputError(f"device {device!r} requested but CUDA is not available on this machine")
    return dev


def resolve_seed(seed: int | None) -> int:
    """Seed to use: the given one, else ``settings.seed``."""
    return settings.seed if seed is None else int(seed)


def seed_everything(seed: int | None) -> int:
    """Seed Python, NumPy and torch (CPU and CUDA); returns the seed used."""
    import torch

    s = resolve_seed(seed)
    random.seed(s)
    np.random.seed(s % (2**32))  # noqa: NPY002 - third-party code draws from the legacy global RNG
    torch.manual_seed(s)
    return s
