"""The base install (``pip install cape-sc``, what ``make run`` installs) carries every package cape runs on.

The test suite runs with the ``dev`` extra, whose packages bring others along (dagma and cell-eval bring igraph): a
package cape needs but only an extra brings passes every other test and fails a new user's first run. These tests
read the installed distribution's own requirements, without its extras, and follow them down.
"""

from __future__ import annotations

import ast
import sys
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import cape

DISTRIBUTION = "cape-sc"
#: Packages that cape's code needs but does not import itself: another library imports them on a path cape takes.
RUNTIME_NEEDS = {"igraph": "scanpy's Leiden clustering (flavor 'igraph'), the cell states of Step I's edge confidence"}


def base_requirements(name: str = DISTRIBUTION) -> set[str]:
    """Every distribution that installing ``name`` without extras installs, ``name`` included (canonical names),
    followed through the installed distributions' metadata."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = canonicalize_name(todo.pop())
        if current in seen:
            continue
        seen.add(current)
        try:
            requires = distribution(current).requires or []
        except PackageNotFoundError:
            continue
        for line in requires:
            requirement = Requirement(line)
            # an extra's requirement (or another platform's) is not installed by the plain install
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def module_level_imports(path: Path) -> set[str]:
    """Top-level names of the absolute imports a module makes when it is imported (its body, outside ``try``:
    imports guarded there or made inside functions are optional paths with their own messages)."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_package_cape_imports_is_installed_by_the_base_install() -> None:
    base = base_requirements()
    providers = packages_distributions()
    missing = {}
    for path in Path(cape.__file__).parent.rglob("*.py"):
        for name in module_level_imports(path) - set(sys.stdlib_module_names) - {"cape", "__future__"}:
            dists = {canonicalize_name(d) for d in providers.get(name, [])}
            if not dists & base:
                missing.setdefault(name, []).append(str(path.relative_to(Path(cape.__file__).parent)))
    assert not missing, f"imported but not installed by `pip install {DISTRIBUTION}`: {missing}"


@pytest.mark.parametrize("package", sorted(RUNTIME_NEEDS))
def test_packages_other_libraries_import_for_cape_are_installed_by_the_base_install(package) -> None:
    assert canonicalize_name(package) in base_requirements(), f"{package} ({RUNTIME_NEEDS[package]})"


def test_the_closure_leaves_extras_out() -> None:
    base = base_requirements()
    assert {"scanpy", "torch", "anndata"} <= base
    assert "pytest" not in base and "dagma" not in base  # the dev extra's
