from __future__ import annotations

import os
import shutil
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
from hypothesis import settings as hypothesis_settings

from cape._settings import THREAD_ENV_VARS
from cape.data.perturbation_data import simulate_perturbation
from cape.tasks.labels import SPLIT_KEY

# The property tests draw the same examples on every run, seeded like everything else: a red run can be repeated.
hypothesis_settings.register_profile("cape", derandomize=True)
hypothesis_settings.load_profile("cape")


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs two workers) each worker gets one torch and BLAS thread: the workers
    share the machine's cores, and two OpenMP threads per worker spinning against each other slow tiny models
    many times over. Snakemake's rules still get the threads their config asks for."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for var in THREAD_ENV_VARS:
            os.environ[var] = "1"
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own empty download cache, so tests never depend on (or fill) the user's cache."""
    monkeypatch.setenv("CAPE_CACHE_DIR", str(tmp_path_factory.mktemp("cape-cache")))


@pytest.fixture
def workdir(tmp_path) -> Path:
    """A temporary folder holding copies of the Snakefile, the workflow rules and the configs."""
    repo = Path(__file__).resolve().parent.parent
    shutil.copy(repo / "Snakefile", tmp_path / "Snakefile")
    shutil.copytree(repo / "workflows", tmp_path / "workflows")
    shutil.copytree(repo / "configs", tmp_path / "configs")
    return tmp_path


@pytest.fixture
def manifest_folder(tmp_path, monkeypatch) -> Path:
    """A private copy of the shipped manifests (used through $CAPE_MANIFEST_DIR) that a test may edit."""
    from cape.data.manifest import manifest_dir

    folder = tmp_path / "manifests"
    shutil.copytree(manifest_dir(), folder)
    monkeypatch.setenv("CAPE_MANIFEST_DIR", str(folder))
    return folder


@pytest.fixture
def counts_adata() -> ad.AnnData:
    """300 cells × 400 genes of Poisson counts with two cell groups; every cell has > 200 detected genes."""
    rng = np.random.default_rng(0)
    rates = rng.gamma(2.0, 1.0, size=400)
    x = rng.poisson(rates, size=(300, 400)).astype(np.float32)
    x[150:, :40] += rng.poisson(5.0, size=(150, 40))
    adata = ad.AnnData(x)
    adata.obs_names = [f"c{i}" for i in range(300)]
    adata.var_names = [f"G{i}" for i in range(400)]
    adata.obs["group"] = pd.Categorical(np.repeat(["a", "b"], 150))
    return adata


@pytest.fixture(autouse=True)
def _restore_cli_state():
    """main() run in-process configures the 'cape' logger, settings and warning display; undo it here."""
    import logging
    import warnings

    import cape

    logger = logging.getLogger("cape")
    saved = (dict(cape.settings.__dict__), warnings.showwarning, list(logger.handlers), logger.level)
    yield
    cape.settings.__dict__.update(saved[0])
    warnings.showwarning = saved[1]
    logger.handlers[:] = saved[2]
    logger.setLevel(saved[3])


@pytest.fixture(autouse=True)
def _restore_threads():
    """`cape.cli.main()` run in-process sets torch's, BLAS's and the environment's thread counts for the whole
    process (cape.settings.n_threads); put them back after each test."""
    import os
    import sys

    from cape._settings import THREAD_ENV_VARS

    env = {var: os.environ.get(var) for var in THREAD_ENV_VARS}
    torch_threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
    yield
    if all(os.environ.get(var) == value for var, value in env.items()):
        return
    for var, value in env.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    if torch_threads is not None:
        import threadpoolctl

        sys.modules["torch"].set_num_threads(torch_threads)
        threadpoolctl.threadpool_limits(limits=torch_threads)
    from cape import settings

    settings._n_threads = None


@pytest.fixture
def trained_adata() -> ad.AnnData:
    """A run's AnnData as `cape train` leaves it: two separable cell types, an embedding, predictions, a split."""
    rng = np.random.default_rng(0)
    n, m = 120, 12
    labels = np.repeat(["T", "B"], n // 2)
    x = rng.poisson(2.0, size=(n, m)).astype(np.float32)
    x[labels == "B", :4] += 6
    adata = ad.AnnData(np.log1p(x))
    adata.obs_names = [f"c{i}" for i in range(n)]
    adata.var_names = [f"g{i}" for i in range(m)]
    adata.obs["cell_type"] = pd.Categorical(labels)
    adata.obsm["X_cape"] = np.c_[(labels == "B") * 3.0, np.zeros(n)] + rng.normal(0, 0.3, (n, 2))
    pred = labels.copy()
    pred[:6] = "B"  # 6 mistakes among the T cells
    adata.obs["cape_cell_type_prediction"] = pd.Categorical(pred)
    adata.obs[SPLIT_KEY] = np.where(np.arange(n) % 10 < 3, "fine_tune", "test")
    dag = np.zeros((m, m))
    dag[0, 1], dag[1, 2], dag[0, 3] = 0.8, -0.5, 0.3
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    adata.varm["cape_poincare"] = rng.uniform(-0.5, 0.5, size=(m, 2))
    adata.var["cape_generality"] = rng.uniform(size=m)
    adata.uns["cape"] = {"causal_graph": {"removed_cycle_edges": 1, "turned_cycle_edges": 2, "wall_time": 1.5}}
    return adata


@pytest.fixture(scope="module")
def tiny_perturbation() -> ad.AnnData:
    """A 20-gene GEARS-format knock-out simulation with its true DAG as ``varp["cape_dag"]`` (the GEARS tests)."""
    adata = simulate_perturbation(n_genes=20, n_edges=30, n_control=60, n_cells_per_perturbation=10, n_single=10,
                                  n_double=8, seed=0)
    adata.varp["cape_dag"] = adata.varp["true_dag"]
    return adata
