"""cape: causality-aware positional encodings for single-cell transformers.

scverse-style API: ``cape.pp`` (preprocessing), ``cape.tl`` (tools), ``cape.pl`` (plots),
``cape.data`` (datasets and readers), ``cape.models`` (the transformer), ``cape.tasks`` (annotation, clustering,
perturbation: splits, metrics, baselines), ``cape.settings``. The paper's experiments are a project of their own
in the repository (``benchmarks/``, the ``cape-bench`` command), which this package never imports.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._errors import CapeInputError
from ._settings import settings

__version__ = "0.1.0"

# Submodules load on first use: ``import cape`` alone does not load torch and scanpy.
_SUBMODULES = {"pp", "tl", "pl", "data", "tasks", "causal", "hyperbolic", "encodings", "models"}

__all__ = ["CapeInputError", "__version__", "settings", *sorted(_SUBMODULES)]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'cape' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _SUBMODULES)
