"""The package's shape: one module per name, no module hidden behind a function of the same name, short
functions, public signatures that group their options (the limits the code is held to)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import types
from collections import Counter
from pathlib import Path

import pytest

import cape

ROOT = Path(cape.__file__).resolve().parent
BENCHMARKS = ROOT.parent / "benchmarks" / "cape_benchmarks"
MAX_LINES = 100
MAX_PARAMS = 12


def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))


def _names(root: Path) -> list[str]:
    """Module and subpackage names under ``root``."""
    return [p.stem for p in _modules(root)] + [p.name for p in root.rglob("*") if (p / "__init__.py").is_file()]


@pytest.mark.parametrize("root", [ROOT, BENCHMARKS], ids=["cape", "cape_benchmarks"])
def test_one_module_per_name(root):
    if not root.is_dir():
        pytest.skip("the benchmarks project is not beside this checkout")
    repeated = {name: n for name, n in Counter(_names(root)).items() if n > 1}
    assert not repeated, f"module names used more than once under {root.name}: {repeated}"


def test_no_module_is_shadowed_by_an_attribute_of_its_package():
    shadowed = []
    for info in pkgutil.walk_packages([str(ROOT)], "cape."):
        if not info.ispkg:
            continue
        package = importlib.import_module(info.name)
        for sub in pkgutil.iter_modules(package.__path__):
            attribute = getattr(package, sub.name, None)
            if attribute is not None and not isinstance(attribute, types.ModuleType):
                shadowed.append(f"{info.name}.{sub.name}")
    assert not shadowed, f"modules hidden behind a function or class of the same name: {shadowed}"


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _n_params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def test_no_function_over_the_line_limit():
    long = [f"{p.relative_to(ROOT.parent)}:{f.lineno} {f.name} ({f.end_lineno - f.lineno + 1} lines)"
            for p in sorted(ROOT.rglob("*.py")) for f in _functions(p)
            if f.end_lineno - f.lineno + 1 > MAX_LINES]
    assert not long, f"functions over {MAX_LINES} lines: {long}"


def test_public_signatures_group_their_options():
    """Plots (``cape.pl``) may keep scanpy-style keyword lists; everything else takes option objects."""
    wide = [f"{p.relative_to(ROOT.parent)}:{f.lineno} {f.name} ({_n_params(f)} parameters)"
            for p in sorted(ROOT.rglob("*.py")) if "pl" not in p.relative_to(ROOT).parts[:1] for f in _functions(p)
            if (not f.name.startswith("_") or f.name == "__init__") and _n_params(f) > MAX_PARAMS]
    assert not wide, f"public functions with more than {MAX_PARAMS} parameters: {wide}"
