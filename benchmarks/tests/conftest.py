"""The benchmarks' tests share the library's test fixtures and helpers: ``tests/conftest.py`` (loaded here under
another module name, so that its fixtures, the autouse ones included, apply to this folder too) and the helper
modules of ``tests/`` (``_models_data``, ``_workflow``), importable by name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_LIBRARY_TESTS = Path(__file__).resolve().parents[2] / "tests"
if str(_LIBRARY_TESTS) not in sys.path:
    sys.path.insert(0, str(_LIBRARY_TESTS))

_spec = importlib.util.spec_from_file_location("_cape_tests_conftest", _LIBRARY_TESTS / "conftest.py")
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)
globals().update({name: value for name, value in vars(_shared).items() if not name.startswith("__")})


@pytest.fixture
def built_models(monkeypatch) -> list[str]:
    """The names of the variants ``cape_benchmarks.encodings`` builds a model for, in order (it still builds them)."""
    from cape_benchmarks import encodings, encodings_models

    names: list[str] = []
    real = encodings_models.build_model

    def counting(data, backbone, variant, settings, seed, device=None, integration="complement"):
        names.append(variant.name)
        return real(data, backbone, variant, settings, seed, device, integration)

    monkeypatch.setattr(encodings, "build_model", counting)
    return names
