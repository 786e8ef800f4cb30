"""The public API is what ``__all__`` says, every name of it is in the API reference, and every AnnData tool
documents the fields it reads and writes."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

API = Path(__file__).resolve().parent.parent / "docs" / "api"
PACKAGES = ("pp", "tl", "pl", "data", "models", "encodings")
FIELD = re.compile(r'``(X|layers|obs|var|obsm|varm|varp|uns)\b')


def _section(doc: str, title: str) -> str | None:
    """Body of a NumPy-docstring section (None when absent)."""
    match = re.search(rf"^{title}\n-{{{len(title)}}}\n(.*?)(?=^\S[^\n]*\n-+\n|\Z)", doc, re.M | re.S)
    return match.group(1) if match else None


def _listed(package: str) -> set[str]:
    """Names in the autosummary blocks of docs/api/<package>.rst."""
    text = (API / f"{package}.rst").read_text(encoding="utf-8")
    assert f".. currentmodule:: cape.{package}" in text
    names: set[str] = set()
    for block in re.findall(r"\.\. autosummary::\n((?:   .*\n|\n)+)", text):
        names |= {line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith(":")}
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_all_names_exist_and_are_documented(package):
    module = importlib.import_module(f"cape.{package}")
    exported = set(module.__all__)
    assert len(exported) == len(module.__all__), "duplicates in __all__"
    for name in exported:
        assert hasattr(module, name), f"cape.{package}.{name} in __all__ does not exist"
        assert inspect.getdoc(getattr(module, name)), f"cape.{package}.{name} has no docstring"
    listed = _listed(package)
    assert exported - listed == set(), f"missing from docs/api/{package}.rst: {sorted(exported - listed)}"
    assert listed - exported == set(), f"docs/api/{package}.rst lists names not in __all__: {sorted(listed - exported)}"


def test_every_public_function_of_tl_and_pp_is_exported():
    for package in ("pp", "tl", "pl"):
        module = importlib.import_module(f"cape.{package}")
        public = {name for name, obj in vars(module).items()
                  if inspect.isfunction(obj) and not name.startswith("_")}
        assert public <= set(module.__all__), f"cape.{package}: {sorted(public - set(module.__all__))}"


@pytest.mark.parametrize("package", ["pp", "tl"])
def test_tools_state_what_they_read_and_write(package):
    module = importlib.import_module(f"cape.{package}")
    for name in module.__all__:
        if inspect.isclass(getattr(module, name)):  # option objects (cape.tl.CausalConfig, EmbeddingConfig)
            continue
        doc = inspect.getdoc(getattr(module, name))
        reads, writes = _section(doc, "Reads"), _section(doc, "Writes")
        assert reads is not None and FIELD.search(reads), f"cape.{package}.{name}: no Reads section naming a field"
        assert writes is not None, f"cape.{package}.{name}: no Writes section"
        assert FIELD.search(writes) or "unchanged" in writes, f"cape.{package}.{name}: Writes names no field"


def test_plots_state_what_they_read():
    module = importlib.import_module("cape.pl")
    for name in module.__all__:
        assert _section(inspect.getdoc(getattr(module, name)), "Reads"), f"cape.pl.{name}: no Reads section"


def test_causal_graph_writes_the_dag():
    import cape

    assert 'varp["cape_dag"]' in _section(inspect.getdoc(cape.tl.causal_graph), "Writes")
