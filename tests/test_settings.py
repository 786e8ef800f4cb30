from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

import cape
from cape import CapeInputError
from cape._settings import resolve_device, seed_everything


def test_auto_device_matches_cuda_availability():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device(None).type == expected
    assert resolve_device("cpu").type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")
def test_cuda_without_cuda_is_a_user_error():
    with pytest.raises(CapeInputError, match="CUDA is not available"):
        resolve_device("cuda")


def test_unknown_device():
    with pytest.raises(CapeInputError, match="unknown device 'tpu0'"):
        resolve_device("tpu0")


def test_seed_everything_is_reproducible():
    seed_everything(3)
    a = torch.rand(4)
    seed_everything(3)
    assert torch.equal(a, torch.rand(4))


def test_verbosity_sets_cape_logger_only():
    root_level = logging.getLogger().level
    old = cape.settings.verbosity
    try:
        cape.settings.verbosity = 3
        assert logging.getLogger("cape").level == logging.DEBUG
        assert logging.getLogger().level == root_level
        with pytest.raises(CapeInputError, match="verbosity must be one of"):
            cape.settings.verbosity = 7
    finally:
        cape.settings.verbosity = old


_NOTEBOOK = """
import logging, sys
import cape
log = logging.getLogger("cape")
log.info("an info line")
log.warning("a warning line")
cape.settings.verbosity = 2
log.info("now info too")
if len(sys.argv) > 1:  # the user configures logging: cape's own handler stands down, nothing is shown twice
    logging.basicConfig(stream=sys.stderr, format="root %(message)s")
    log.warning("once")
"""


def test_messages_reach_stderr_where_nothing_else_shows_them():
    # a notebook with no logging configured: warnings shown (verbosity 1), infos once verbosity is 2
    shown = subprocess.run([sys.executable, "-c", _NOTEBOOK], capture_output=True, text=True, check=True).stderr
    lines = [line for line in shown.splitlines() if line.startswith(("cape", "root"))]
    assert lines == ["cape: warning: a warning line", "cape: now info too"]
    shown = subprocess.run([sys.executable, "-c", _NOTEBOOK, "configured"], capture_output=True, text=True,
                           check=True).stderr
    lines = [line for line in shown.splitlines() if line.startswith(("cape", "root"))]
    assert lines == ["cape: warning: a warning line", "cape: now info too", "root once"]


def test_progress_respects_setting():
    old = cape.settings.progress
    try:
        cape.settings.progress = False
        assert not cape.settings.show_progress()
        cape.settings.progress = True
        assert cape.settings.show_progress()
    finally:
        cape.settings.progress = old


# ------------------------------------------------------------------------------------------------ threads
def _cgroup_tree(tmp_path, files: dict[str, str], proc: str = "0::/\n"):
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    proc_file = tmp_path / "proc_cgroup"
    proc_file.write_text(proc)
    return root, proc_file


@pytest.mark.parametrize(
    "files, proc, expected",
    [
        ({"cpu.max": "150000 100000\n"}, "0::/\n", 1.5),                       # v2 at the mount root
        ({"cpu.max": "max 100000\n"}, "0::/\n", None),                         # v2 unlimited
        ({"job/cpu.max": "200000 100000\n", "cpu.max": "max 100000\n"}, "0::/job\n", 2.0),  # v2 own cgroup
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, "3:cpu,cpuacct:/\n", 3.0),
        ({"cpu,cpuacct/slurm/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/slurm/cpu.cfs_period_us": "100000\n"},
         "4:cpuacct,cpu:/slurm\n", 0.5),                                         # v1 own cgroup, joint mount
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "3:cpu:/\n", None),  # v1 unlimited
        ({"cpu.max": "garbage\n"}, "0::/\n", None),
        ({}, "", None),                                                          # no cgroup files at all
    ],
)
def test_cgroup_cpu_limit(tmp_path, files, proc, expected):
    from cape._settings import cgroup_cpu_limit

    root, proc_file = _cgroup_tree(tmp_path, files, proc)
    assert cgroup_cpu_limit(root, proc_file) == expected


@pytest.mark.parametrize("affinity, quota, expected", [(8, None, 8), (8, "150000 100000", 2), (8, "20000 100000", 1),
                                                       (2, "800000 100000", 2), (1, None, 1)])
def test_available_cpus_is_affinity_capped_by_quota(tmp_path, monkeypatch, affinity, quota, expected):
    from cape._settings import available_cpus

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(affinity)), raising=False)
    root, proc_file = _cgroup_tree(tmp_path, {"cpu.max": f"{quota}\n"} if quota else {})
    assert available_cpus(root, proc_file) == expected


def test_available_cpus_on_this_machine():
    import os

    from cape._settings import available_cpus

    assert 1 <= available_cpus() <= len(os.sched_getaffinity(0))


def test_n_threads_sets_torch_and_blas():
    import threadpoolctl

    cape.settings.n_threads = 1
    assert torch.get_num_threads() == 1
    assert cape.settings.n_threads == 1
    assert all(lib["num_threads"] == 1 for lib in threadpoolctl.threadpool_info())
    import os

    assert os.environ["OMP_NUM_THREADS"] == "1"
    for bad in (0, -2, 1.5, "2", True):
        with pytest.raises(CapeInputError, match="threads must be a positive integer"):
            cape.settings.n_threads = bad
    assert cape.settings.n_threads == 1


def test_cli_threads_option(capsys):
    from cape.cli import main

    torch.set_num_threads(2)
    assert main(["--quiet", "--threads", "1", "encodings"]) == 0
    assert torch.get_num_threads() == 1
    capsys.readouterr()
    with pytest.raises(SystemExit) as usage:
        main(["--threads", "0", "encodings"])
    assert usage.value.code == 2
    assert "--threads: expected a positive integer, got '0'" in capsys.readouterr().err


@pytest.mark.parametrize("cpus, torch_default, expected", [(4, 8, 4), (8, 1, 1), (1, 1, 1)])
def test_cli_default_threads(monkeypatch, capsys, cpus, torch_default, expected):
    """Without --threads: the CPUs this process may use, never more than torch's own default (OMP_NUM_THREADS)."""
    from cape.cli import main

    monkeypatch.setattr("cape._settings.available_cpus", lambda *a, **k: cpus)
    torch.set_num_threads(torch_default)
    assert main(["--quiet", "encodings"]) == 0
    assert torch.get_num_threads() == expected and cape.settings.n_threads == expected
    capsys.readouterr()


def test_numba_pool_cannot_reset_torch_threads():
    """numba's OpenMP pool, when it starts, sets OpenMP's thread count to NUMBA_NUM_THREADS, which torch shares:
    a parallel numba function (scanpy's normalize_total on sparse counts) must leave torch's count as it was set,
    by the environment or by cape. A fresh process, so that no earlier test has started numba's pool."""
    code = (
        "import anndata as ad, numpy as np, scanpy as sc, scipy.sparse as sp, torch\n"
        "import cape\n"
        "def normalised():\n"
        "    sc.pp.normalize_total(ad.AnnData(sp.random(300, 40, density=0.3, format='csr', dtype=np.float32,\n"
        "                                               random_state=0)))\n"
        "    return torch.get_num_threads()\n"
        "print(torch.get_num_threads())\n"  # torch has set up its threads before numba's first parallel function
        "print(normalised())\n"
        "cape.settings.n_threads = 2\n"
        "print(normalised())\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "3"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "1", "2"]
