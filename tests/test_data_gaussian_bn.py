"""bnlearn linear Gaussian networks: reading the JSON, exact moments, interventions, and load() from a wheel."""

from __future__ import annotations

import hashlib
import json
import zipfile

import numpy as np
import pytest
import yaml

import cape
from cape import CapeInputError
from cape.data.gaussian_bn import read_gaussian_bn

# a → b → c, a → c, d alone: the layout of pgmpy's ecoli70.json.
NETWORK = {
    "nodes": ["a", "b", "c", "d"],
    "arcs": [["a", "b"], ["b", "c"], ["a", "c"]],
    "cpds": {
        "a": {"coefficients": {"(Intercept)": [1.0]}, "variance": [0.5], "parents": []},
        "b": {"coefficients": {"(Intercept)": [0.2], "a": [0.8]}, "variance": [0.3], "parents": ["a"]},
        "c": {"coefficients": {"(Intercept)": [-0.5], "b": [-1.2], "a": [0.4]}, "variance": [0.2],
              "parents": ["b", "a"]},
        "d": {"coefficients": {"(Intercept)": [3.0]}, "variance": [1.0], "parents": []},
    },
}


@pytest.fixture
def network_file(tmp_path):
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(NETWORK))
    return path


def test_reads_coefficients_and_samples_the_exact_moments(network_file) -> None:
    bn = read_gaussian_bn(network_file)
    assert bn.genes == ("a", "b", "c", "d") and bn.name == "toy"
    assert bn.weights[0, 1] == 0.8 and bn.weights[1, 2] == -1.2 and bn.weights[0, 2] == 0.4
    # The means by hand along the order: a = 1, b = 0.2 + 0.8, c = −0.5 − 1.2·b + 0.4·a, d = 3.
    np.testing.assert_allclose(bn.mean(), [1.0, 1.0, -1.3, 3.0])
    X = bn.sample(200_000, np.random.default_rng(0))
    np.testing.assert_allclose(X.mean(0), bn.mean(), atol=0.01)
    np.testing.assert_allclose(np.cov(X.T), bn.covariance(), atol=0.01)
    assert bn.covariance()[1, 1] == pytest.approx(0.8**2 * 0.5 + 0.3)


def test_a_knockdown_holds_its_gene_and_leaves_its_ancestors_alone(network_file) -> None:
    bn = read_gaussian_bn(network_file)
    adata = bn.simulate(n_control=500, knockdowns=["b"], cells_per_knockdown=400, depth=3.0, seed=1)
    assert adata.shape == (900, 4) and list(adata.obs["condition"].cat.categories) == ["ctrl", "b+ctrl"]
    knocked = adata[adata.obs["condition"] == "b+ctrl"].X
    held = bn.mean()[1] - 3.0 * np.sqrt(bn.covariance()[1, 1])
    np.testing.assert_allclose(knocked[:, 1], held, rtol=1e-6)
    # a is b's parent: unchanged; c moves by −1.2 times b's shift.
    assert abs(knocked[:, 0].mean() - bn.mean()[0]) < 0.1
    assert knocked[:, 2].mean() == pytest.approx(bn.mean()[2] - 1.2 * (held - bn.mean()[1]), abs=0.1)
    assert adata.varp["true_dag"].nnz == 3 and adata.uns["simulation"]["knockdowns"] == ["b"]
    # Knock-downs by count: the genes with the most descendants first (a reaches b and c).
    assert bn.simulate(n_control=10, knockdowns=2, cells_per_knockdown=5).uns["simulation"]["knockdowns"] == ["a", "b"]
    np.testing.assert_array_equal(bn.simulate(n_control=50, seed=3).X, bn.simulate(n_control=50, seed=3).X)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda n: n["cpds"]["a"].update(parents=["c"], coefficients={"(Intercept)": [0.0], "c": [1.0]}), "cycle"),
    (lambda n: n["cpds"]["b"].update(parents=["z"]), "parent z is not a node"),
    (lambda n: n["cpds"]["d"].update(variance=[0.0]), "positive residual variance"),
    (lambda n: n["cpds"].pop("d"), "no distribution for gene d"),
    (lambda n: n.pop("nodes"), "not a Gaussian network"),
])
def test_bad_networks_are_refused_in_one_line(tmp_path, edit, message) -> None:
    network = json.loads(json.dumps(NETWORK))
    edit(network)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(network))
    with pytest.raises(CapeInputError, match=message):
        read_gaussian_bn(path)
    bn = read_gaussian_bn(_write(tmp_path, NETWORK))
    with pytest.raises(CapeInputError, match="not in"):
        bn.simulate(knockdowns=["q"])


def _write(folder, network) -> str:
    path = folder / "ok.json"
    path.write_text(json.dumps(network))
    return str(path)


def test_load_reads_the_network_from_the_pgmpy_wheel(tmp_path, monkeypatch, manifest_folder) -> None:
    """ecoli70 through the manifest, from a stand-in pgmpy wheel in a local folder (offline)."""
    house = tmp_path / "wheels"
    house.mkdir()
    data = json.dumps(NETWORK).encode()
    with zipfile.ZipFile(house / "pgmpy-1.1.2-py3-none-any.whl", "w") as zf:
        zf.writestr("pgmpy/utils/example_models/ecoli70.json", data)
        zf.writestr("pgmpy-1.1.2.dist-info/METADATA", "Metadata-Version: 2.1\nName: pgmpy\nVersion: 1.1.2\n")
        zf.writestr("pgmpy-1.1.2.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("pgmpy-1.1.2.dist-info/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(house))
    manifest = yaml.safe_load((manifest_folder / "ecoli70.yaml").read_text())
    manifest["files"][0]["sha256"] = hashlib.sha256(data).hexdigest()
    (manifest_folder / "ecoli70.yaml").write_text(yaml.safe_dump(manifest))
    adata = cape.data.load("ecoli70")
    # 2,000 controls and 100 cells per knock-down of every gene (the toy has 4, fewer than the 10 asked for).
    assert adata.n_vars == 4 and adata.obs["condition"].value_counts()["ctrl"] == 2000
    assert adata.uns["cape"]["dataset"]["keys"]["graph"] == "true_dag"
