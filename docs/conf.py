"""Sphinx configuration of cape's documentation: the API reference from the NumPy docstrings and the tutorials.

Build with ``make docs`` (HTML in ``docs/_build/html``; warnings are errors). The notebooks are not executed here:
``tests/test_tutorials.py`` runs them, and the committed files carry no outputs.
"""

from __future__ import annotations

import cape

project = "cape"
author = "cape developers"
copyright = "cape developers"
version = release = cape.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_nb",
]

# myst-nb reads .ipynb (and .md); the tutorials run in the test suite, not during the docs build.
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath"]

exclude_patterns = ["_build", "jupyter_execute", "**.ipynb_checkpoints"]
templates_path = ["_templates"]

autosummary_generate = True
autosummary_imported_members = True
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_default_options = {"show-inheritance": False}

# NumPy-style docstrings. Every AnnData tool documents the fields it reads and writes in "Reads" / "Writes"
# sections (tests/test_public_api.py checks that they are there).
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_custom_sections = ["Reads", "Writes"]

html_theme = "alabaster"
html_title = f"cape {release}"
html_static_path: list[str] = []
smartquotes = False  # keep ``varp["cape_dag"]`` searchable as typed
