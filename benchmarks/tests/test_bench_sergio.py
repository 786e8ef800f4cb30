"""SERGIO's driver: the child's inputs and outputs, its errors, and (where SERGIO is installed) a real simulation."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from cape import CapeInputError
from cape_benchmarks import causal as bench_causal
from cape_benchmarks import sergio

FAKE_CHILD = """
import os
import sys
import numpy as np
assert os.environ["PYTHONHASHSEED"] == "0"
data = np.load(sys.argv[1])
genes = np.unique(np.concatenate([data["sources"], data["targets"]]))
n = int(data["n_types"]) * int(data["cells_per_type"])
counts = np.arange(n * genes.size, dtype=float).reshape(n, genes.size) % 7
assert set(np.unique(data["signs"])) <= {-1.0, 1.0}
np.savez(sys.argv[2], counts=counts, cell_type=np.repeat(np.arange(int(data["n_types"])), int(data["cells_per_type"])),
         genes=genes)
"""


def _use_child(text: str, tmp_path, monkeypatch) -> None:
    """Make the driver run ``text`` with this Python instead of SERGIO's child."""
    child = tmp_path / "child.py"
    child.write_text(text)
    monkeypatch.setattr(sergio, "_CHILD", child)
    monkeypatch.setenv(sergio.SERGIO_PYTHON_ENV, sys.executable)


def test_the_driver_passes_the_dag_and_reads_back_the_simulated_genes(tmp_path, monkeypatch) -> None:
    _use_child(FAKE_CHILD, tmp_path, monkeypatch)
    W = np.zeros((4, 4))
    W[0, 1], W[1, 2] = 0.7, -1.3  # gene 3 has no edge: not simulated
    counts, cell_type, genes = sergio.simulate_sergio(W, n_types=2, cells_per_type=5, seed=1)
    assert counts.shape == (10, 3) and list(genes) == [0, 1, 2] and list(np.bincount(cell_type)) == [5, 5]
    (tmp_path / "child.py").write_text("import sys; sys.exit('boom: bad network')")
    with pytest.raises(CapeInputError, match="SERGIO failed: boom: bad network"):
        sergio.simulate_sergio(W)


def test_without_sergio_the_error_says_how_to_install_it(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(sergio.SERGIO_PYTHON_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sergio, "sergio_python", lambda: None)
    with pytest.raises(CapeInputError, match="make sergio-env"):
        sergio.simulate_sergio(np.eye(3, k=1))


def test_the_sergio_setting_scores_against_the_simulated_genes_only(tmp_path, monkeypatch) -> None:
    import json

    network = {"nodes": ["a", "b", "c"], "cpds": {
        "a": {"coefficients": {"(Intercept)": [0.0]}, "variance": [1.0], "parents": []},
        "b": {"coefficients": {"(Intercept)": [0.0], "a": [0.9]}, "variance": [1.0], "parents": ["a"]},
        "c": {"coefficients": {"(Intercept)": [0.0]}, "variance": [1.0], "parents": []}}}
    path = tmp_path / "ecoli70.json"
    path.write_text(json.dumps(network))
    monkeypatch.setattr(bench_causal.data, "fetch", lambda name: {"network": path})
    rng = np.random.default_rng(0)
    monkeypatch.setattr(bench_causal, "simulate_sergio", lambda W, seed: (
        rng.poisson(5.0, size=(40, 2)).astype(float), np.zeros(40, int), np.array([0, 1])))
    X, truth, mask = bench_causal._dataset("sergio_ecoli70", 0, None)
    assert X.shape == (40, 2) and mask is None
    np.testing.assert_array_equal(truth, [[0.0, 0.9], [0.0, 0.0]])


@pytest.mark.skipif(sergio.sergio_python() is None, reason="SERGIO is not installed (make sergio-env)")
def test_real_sergio_simulates_counts_with_cell_types() -> None:
    W = np.zeros((5, 5))
    W[0, 1], W[0, 2], W[1, 3], W[2, 4] = 1.0, -1.0, 1.0, 1.0
    counts, cell_type, genes = sergio.simulate_sergio(W, n_types=2, cells_per_type=30, seed=0)
    assert list(np.bincount(cell_type)) == [30, 30]
    assert counts.shape == (60, 5) and list(genes) == [0, 1, 2, 3, 4]
    assert np.all(counts >= 0) and np.allclose(counts, np.round(counts)) and counts.sum() > 0
    again, _, _ = sergio.simulate_sergio(W, n_types=2, cells_per_type=30, seed=0)  # a new process, same counts
    np.testing.assert_array_equal(counts, again)


FAKE_KNOCKOUT_CHILD = """
import sys
import numpy as np
data = np.load(sys.argv[1])
genes = np.unique(np.concatenate([data["sources"], data["targets"]]))
ko, per_type, n_types = data["knockouts"], int(data["knockout_cells_per_type"]), int(data["n_types"])
n = n_types * (int(data["cells_per_type"]) + len(ko) * per_type)
condition = np.concatenate([np.full(n_types * int(data["cells_per_type"]), -1)]
                           + [np.full(n_types * per_type, k) for k in range(len(ko))])
np.savez(sys.argv[2], counts=np.ones((n, genes.size)), cell_type=np.zeros(n, int), genes=genes, condition=condition,
         knockouts=ko)
"""


def test_the_knockout_driver_pads_the_knockouts_and_reads_back_each_cells_condition(tmp_path, monkeypatch) -> None:
    _use_child(FAKE_KNOCKOUT_CHILD, tmp_path, monkeypatch)
    W = np.zeros((4, 4))
    W[0, 1], W[1, 2] = 0.7, -1.3
    counts, _, condition, genes = sergio.simulate_sergio_knockouts(
        W, [[0], [0, 1]], n_types=2, cells_per_type=5, knockout_cells_per_type=3)
    assert counts.shape == (2 * (5 + 2 * 3), 3) and list(genes) == [0, 1, 2]
    assert list(np.bincount(condition + 1)) == [10, 6, 6]
    with pytest.raises(CapeInputError, match="edge in the network"):
        sergio.simulate_sergio_knockouts(W, [[3]])  # gene 3 has no edge: SERGIO does not simulate it
    with pytest.raises(CapeInputError, match="at least one gene"):
        sergio.simulate_sergio_knockouts(W, [[]])


@pytest.mark.skipif(sergio.sergio_python() is None, reason="SERGIO is not installed (make sergio-env)")
@pytest.mark.parametrize("seed", [0, 2])
def test_real_sergio_knockouts_hold_their_genes_at_zero_and_move_their_children(seed: int) -> None:
    W = np.zeros((6, 6))
    W[0, 1], W[0, 2], W[3, 4], W[3, 5] = 1.0, -1.0, 1.0, 1.0  # 0 activates 1 and represses 2
    counts, _, condition, genes = sergio.simulate_sergio_knockouts(
        W, [[0], [0, 3]], n_types=2, cells_per_type=60, knockout_cells_per_type=30, seed=seed)
    assert list(np.bincount(condition + 1)) == [120, 60, 60] and list(genes) == [0, 1, 2, 3, 4, 5]
    control, ko0, ko03 = (counts[condition == k] for k in (-1, 0, 1))
    assert ko0[:, 0].sum() == 0 and ko03[:, [0, 3]].sum() == 0
    assert control[:, 0].sum() > 0 and control[:, 3].sum() > 0
    # gene 1's only regulator is an activator: knocked out, it has no production left; gene 2 loses its repressor
    assert ko0[:, 1].sum() == 0 and control[:, 1].sum() > 0
    assert ko0[:, 2].mean() > control[:, 2].mean()
    # seed 2 leaves cells without any expression once 0 and 3 are out: empty, not NaN in SERGIO's library size
    assert np.isfinite(counts).all()
