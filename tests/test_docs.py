"""The Sphinx documentation builds without warnings, and the API pages list the AnnData fields of each tool."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """HTML of a copy of docs/ (autosummary writes its pages into the source tree, so never build in place)."""
    root = tmp_path_factory.mktemp("docs")
    source = root / "source"
    shutil.copytree(DOCS, source, ignore=shutil.ignore_patterns("_build", "generated", "jupyter_execute"))
    out = root / "html"
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           "-d", str(root / "doctrees"), str(source), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"sphinx-build failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_docs_build_without_warnings(built):
    assert (built / "index.html").exists()
    for name in ("01_your_data", "02_reading_the_graph", "03_comparing_encodings"):
        assert (built / "tutorials" / f"{name}.html").exists()


def test_causal_graph_page_lists_its_fields(built):
    page = built / "api" / "generated" / "cape.tl.causal_graph.html"
    text = _text(page)
    assert 'varp["cape_dag"]' in text
    assert "Reads" in text and "Writes" in text


def test_every_public_name_has_a_page(built):
    import importlib

    for package in ("pp", "tl", "pl", "data", "models", "encodings"):
        module = importlib.import_module(f"cape.{package}")
        for name in module.__all__:
            assert (built / "api" / "generated" / f"cape.{package}.{name}.html").exists(), f"cape.{package}.{name}"


def test_readme_is_the_front_door():
    """README.md stays short, keeps the set-up commands CI runs (.ci/run calls `make test`) and links to pages that
    exist; the measurements live in docs/benchmarks."""
    root = DOCS.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for command in ("make run", "make test", "make docs"):
        assert command in readme, command
    assert "make test" in (root / ".ci" / "run").read_text(encoding="utf-8")
    assert "\n## What the benchmarks answer\n" in readme
    links = re.findall(r"\]\(((?:docs|configs)/[^)#\s]+)\)", readme)
    assert any(link.startswith("docs/benchmarks/") for link in links)
    missing = [link for link in links if not (root / link).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_data_contract_is_written_once():
    """The AnnData keys table lives in docs/data_contract.md; the README and the API index link to it."""
    contract = (DOCS / "data_contract.md").read_text(encoding="utf-8")
    assert '`obs["cape_split"]`' in contract and '`varp["cape_dag"]`' in contract
    assert "docs/data_contract.md" in (DOCS.parent / "README.md").read_text(encoding="utf-8")
    api_index = (DOCS / "api" / "index.rst").read_text(encoding="utf-8")
    assert "data_contract" in api_index and 'varp["cape_dag"]' not in api_index
