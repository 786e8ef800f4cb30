# Two entry points for a fresh machine (see README):
#   make run    install into .venv, then run the workflow on the embedded default dataset
#   make test   install into .venv (with the dev extra), then run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A plain "torch" requirement pulls the newest CUDA build (GBs); pin a version that has a local CPU wheel here.
TORCH ?= torch==2.13.0
CORES ?= 2
PYTEST_ARGS ?=

.PHONY: run test install install-dev lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.torch: | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH)"
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

run: install
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/snakemake --cores $(CORES)

# The import layers (pyproject [tool.importlinter]) first; pytest exits 5 when it collects no test: that is not a
# failure of the code.
test: install-dev
	$(VENV)/bin/lint-imports
	MPLBACKEND=agg $(PY) -m pytest $(PYTEST_ARGS) || [ $$? -eq 5 ]

lint: install-dev
	$(VENV)/bin/ruff check cape tests
	$(VENV)/bin/lint-imports

clean:
	rm -rf results logs benchmarks .snakemake
