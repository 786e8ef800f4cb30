# Two entry points for a fresh machine (see README):
#   make run    install into .venv, then run the workflow on the embedded default dataset
#   make test   install into .venv (with the dev extra), then run the test suite (tutorial notebooks included):
#               tests/ (the library) and benchmarks/tests (the benchmarks project, `cape-bench`)
#   make docs   install the docs extra, then build the API reference and the tutorials into docs/_build/html
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A plain "torch" requirement pulls the newest CUDA build (GBs); pin a version that has a local CPU wheel here.
TORCH ?= torch==2.13.0
CORES ?= 2
PYTEST_ARGS ?=
# pytest-xdist workers: most long tests wait on one single-threaded process (Snakemake, a notebook kernel); 0: serial
PYTEST_WORKERS ?= 2

.PHONY: run test install install-dev install-docs docs test-data lint clean sdcd-env grnboost2-env sergio-env \
	device-wheels

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

$(VENV)/.installed-docs: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[docs]"
	touch $@

# The SDCD / DCD-FG peers of `cape-bench causal` in an environment of their own: sdcd 0.1.4 pins pandas < 2
# (cape needs 2) and imports an old wandb that needs pkg_resources (setuptools < 70). Torch first, so that
# sdcd's torch requirement does not pull the CUDA build. cape finds ./.venv-sdcd by itself.
SDCD_VENV ?= .venv-sdcd
sdcd-env: $(SDCD_VENV)/.installed
$(SDCD_VENV)/.installed:
	$(PYTHON) -m venv $(SDCD_VENV)
	$(SDCD_VENV)/bin/python -m pip install --quiet "$(TORCH)"
	$(SDCD_VENV)/bin/python -m pip install --quiet sdcd==0.1.4 pytorch_lightning
	$(SDCD_VENV)/bin/python -m pip install --quiet "setuptools<70"
	WANDB_MODE=disabled $(SDCD_VENV)/bin/python -c "import sdcd"
	touch $@

# Wheels for a lent GPU machine (benchmarks/device_checks.sh; docs/benchmarks/throughput.md). Its image (Python 3.12,
# x86-64) has torch, numpy, scipy, pandas, scikit-learn, matplotlib, h5py, numba and networkx but none of these, which
# cape and its benchmarks import; their other needs are in the image. Pinned to one set that resolves together.
DEVICE_WHEELS ?= anndata==0.12.19 array-api-compat==1.16.0 donfig==0.8.1.post1 gcastle==1.0.4 geoopt==0.5.1 \
	google-crc32c==1.9.0 igraph==1.0.0 texttable==1.7.2 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
	referencing==0.37.0 rpds-py==2026.9.1 legacy-api-wrap==1.5 msgspec==0.23.0 natsort==8.4.0 numcodecs==0.17.1 \
	platformdirs==4.14.8 pynndescent==0.7.0 scanpy==1.11.5 scverse-misc==0.1.7 session-info2==0.4.2 umap-learn==0.5.12 \
	zarr==3.4.2
DEVICE_PLATFORMS := $(foreach p,manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1,\
	--platform $(p)_x86_64)
device-wheels: | $(PY)
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(DEVICE_PLATFORMS) -d .whl $(DEVICE_WHEELS)

# GRNBoost2 (arboreto) breaks on dask >= 2024.2 (dask-expr) and needs NumPy < 2: its own environment.
GRNBOOST2_VENV ?= .venv-grnboost2
grnboost2-env: $(GRNBOOST2_VENV)/.installed
$(GRNBOOST2_VENV)/.installed:
	$(PYTHON) -m venv $(GRNBOOST2_VENV)
	$(GRNBOOST2_VENV)/bin/python -m pip install --quiet arboreto==0.1.6 "dask[dataframe]==2024.1.1" \
		distributed==2024.1.1 "pandas<2.2" "numpy<2"
	$(GRNBOOST2_VENV)/bin/python -c "import arboreto.algo, distributed"
	touch $@

# SERGIO (count simulation for `cape-bench causal --settings sergio_ecoli70`) is GPL-3: cape runs it as a separate
# program in an environment of its own.
SERGIO_VENV ?= .venv-sergio
sergio-env: $(SERGIO_VENV)/.installed
$(SERGIO_VENV)/.installed:
	$(PYTHON) -m venv $(SERGIO_VENV)
	$(SERGIO_VENV)/bin/python -m pip install --quiet sergio-scsim==1.9.3
	$(SERGIO_VENV)/bin/python -c "import SERGIO.Noise"
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev
install-docs: $(VENV)/.installed-docs

run: install
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/snakemake --cores $(CORES)

# The import layers (pyproject [tool.importlinter]) first. numba compiles dcor's kernels (GEARS imports dcor) at
# their first import and caches them: compile them once here, so that the pytest workers load them rather than compile
# them side by side. A run in which no test ran fails: pytest exits 5 also when every worker crashed.
test: install-dev test-data
	$(VENV)/bin/lint-imports
	$(PY) -c "import dcor"
	MPLBACKEND=agg $(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# Tutorial 02 reads Sachs 2005, which ships inside the cdt 0.6.0 wheel: pip downloads it from PyPI once (checksums
# verified) into cape's cache; later runs find it there and need no network.
test-data: install
	$(VENV)/bin/cape --quiet data fetch sachs2005 >/dev/null

# The API reference and the tutorials (not executed here: the tests run them). Warnings are errors.
docs: install-docs
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@echo "docs: $(abspath docs/_build/html/index.html)"

lint: install-dev
	$(VENV)/bin/ruff check cape benchmarks tests
	$(VENV)/bin/lint-imports

clean:
	rm -rf results logs .snakemake docs/_build docs/api/generated docs/jupyter_execute
