from __future__ import annotations

import hashlib
import io
import shutil
import zipfile
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import yaml

import cape
from cape import CapeInputError
from cape.data.loaders import SACHS_CONDITIONS
from cape.data.manifest import manifest_dir, validate_manifest


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _edit_manifest(folder: Path, name: str, **changes) -> None:
    path = folder / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    data.update(changes)
    path.write_text(yaml.safe_dump(data))


def test_shipped_manifests_are_valid():
    known = cape.data.manifests()
    assert {"pbmc68k_reduced", "krumsiek11", "sachs2005", "norman2019"} <= set(known)
    assert {m.source["type"] for m in known.values()} == {"package", "pypi_wheel", "url"}
    assert cape.data.available() == list(known)


def test_manifest_schema_names_the_problem():
    data = yaml.safe_load((manifest_dir() / "krumsiek11.yaml").read_text())
    del data["license"]
    with pytest.raises(CapeInputError, match="'license' is a required property"):
        validate_manifest(data, where="m.yaml")
    data = yaml.safe_load((manifest_dir() / "krumsiek11.yaml").read_text())
    data["files"][0]["sha256"] = "abc"
    with pytest.raises(CapeInputError, match=r"invalid manifest at files\.0\.sha256"):
        validate_manifest(data, where="m.yaml")


def test_unknown_dataset_lists_known():
    with pytest.raises(CapeInputError, match="unknown dataset 'pbmc3k'; known datasets: .*pbmc68k_reduced"):
        cape.data.load("pbmc3k")


def test_pbmc68k_reduced_uses_raw_log_expression():
    adata = cape.data.load("pbmc68k_reduced")
    assert adata.shape == (700, 765)
    assert "log1p" in adata.uns
    x = adata.X.toarray()
    assert x.min() >= 0
    # .raw is log-normalised (non-negative, log scale, ~2,000 of 10,000 counts per cell fall on these 765 genes),
    # unlike the scaled X (centred, max 28).
    assert x.max() < 15
    assert 1000 < np.expm1(x).sum(axis=1).mean() < 3000
    assert adata.obs["bulk_labels"].nunique() == 10
    assert adata.uns["cape"]["dataset"]["keys"]["labels"] == "bulk_labels"


def test_krumsiek11_with_network():
    adata = cape.data.load("krumsiek11")
    assert adata.shape == (640, 11)
    assert adata.obs["cell_type"].value_counts().to_dict() == {"progenitor": 320, "Mo": 80, "Ery": 80, "Mk": 80,
                                                               "Neu": 80}
    graph = adata.varp["true_graph"]
    assert graph.nnz == 26  # 30 couplings minus 4 self-couplings
    genes = list(adata.var_names)
    # "Gata2 Pu.1 -1.15": Pu.1 represses Gata2, stored as source Pu.1 → target Gata2.
    assert graph[genes.index("Pu.1"), genes.index("Gata2")] == pytest.approx(-1.15)
    assert graph.diagonal().sum() == 0


def _fake_cdt_wheel(folder: Path, rng: np.random.Generator) -> tuple[bytes, bytes]:
    """A wheel with the same name and file layout as cdt 0.6.0, holding random data of the right shape."""
    cols = ["praf", "pmek", "plcg", "PIP2", "PIP3", "p44/42", "pakts473", "PKA", "PKC", "P38", "pjnk"]
    n = sum(size for _, size, _ in SACHS_CONDITIONS)
    buf = io.StringIO()
    pd.DataFrame(rng.gamma(2.0, 20.0, size=(n, 11)).round(2), columns=cols).to_csv(buf, index=False)
    data = buf.getvalue().encode()
    target = b'"Cause","Effect"\n"plcg","PIP2"\n"PIP2","PIP3"\n"PIP3","plcg"\n"PKA","praf"\n'
    with zipfile.ZipFile(folder / "cdt-0.6.0-py3-none-any.whl", "w") as zf:
        zf.writestr("cdt/data/resources/cyto_full_data.csv", data)
        zf.writestr("cdt/data/resources/cyto_full_target.csv", target)
        zf.writestr("cdt-0.6.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: cdt\nVersion: 0.6.0\n")
        zf.writestr("cdt-0.6.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("cdt-0.6.0.dist-info/RECORD", "")
    return data, target


@pytest.fixture
def local_wheelhouse(tmp_path, monkeypatch, manifest_folder):
    """Point pip at a local folder (offline) holding a stand-in cdt wheel; pin its checksums in the manifest."""
    house = tmp_path / "wheels"
    house.mkdir()
    data, target = _fake_cdt_wheel(house, np.random.default_rng(1))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(house))
    m = yaml.safe_load((manifest_folder / "sachs2005.yaml").read_text())
    m["files"][0]["sha256"] = _sha(data)
    m["files"][1]["sha256"] = _sha(target)
    (manifest_folder / "sachs2005.yaml").write_text(yaml.safe_dump(m))
    return house


def test_sachs_from_wheel_recovers_conditions(local_wheelhouse):
    adata = cape.data.load("sachs2005")
    assert adata.shape == (7466, 11)
    counts = adata.obs["condition"].value_counts(sort=False)
    assert [(c, n) for c, n in counts.items()] == [(c, n) for c, n, _ in SACHS_CONDITIONS]
    assert adata.obs.loc[adata.obs["condition"] == "cd3cd28+u0126", "target"].unique().tolist() == ["pmek"]
    assert int(adata.obs["observational"].sum()) == 853 + 902
    assert adata.varp["true_graph"].nnz == 4
    # Second load is served from the cache (pip is not needed any more).
    shutil.rmtree(local_wheelhouse)
    assert cape.data.load("sachs2005").shape == (7466, 11)


def test_checksum_mismatch_caches_nothing(local_wheelhouse, manifest_folder):
    m = yaml.safe_load((manifest_folder / "sachs2005.yaml").read_text())
    m["files"][0]["sha256"] = "0" * 64
    (manifest_folder / "sachs2005.yaml").write_text(yaml.safe_dump(m))
    with pytest.raises(CapeInputError, match="checksum mismatch for sachs2005 file 'cyto_full_data.csv'"):
        cape.data.fetch("sachs2005")
    assert not (cape.data.cache_dir() / "sachs2005" / "cyto_full_data.csv").exists()


def test_corrupted_cache_is_fetched_again(local_wheelhouse, caplog):
    files = cape.data.fetch("sachs2005")
    good = files["data"].read_bytes()
    files["data"].write_bytes(good[:-100])
    with caplog.at_level("WARNING", logger="cape"):
        again = cape.data.fetch("sachs2005")
    assert "corrupted" in caplog.text
    assert again["data"].read_bytes() == good


def test_pip_failure_is_one_line(manifest_folder, monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # empty: the wheel cannot be found
    with pytest.raises(CapeInputError, match=r"could not download cdt==0\.6\.0 with pip") as info:
        cape.data.fetch("sachs2005")
    assert "\n" not in str(info.value)


def _gears_h5ad(path: Path) -> ad.AnnData:
    rng = np.random.default_rng(0)
    conditions = ["ctrl"] * 20 + ["A+ctrl"] * 10 + ["A+B"] * 10
    adata = ad.AnnData(np.log1p(rng.poisson(2.0, size=(40, 6))).astype(np.float32))
    adata.obs["condition"] = pd.Categorical(conditions)
    adata.obs["cell_type"] = "K562"
    adata.var["gene_name"] = ["A", "B", "C", "D", "E", "F"]
    adata.var_names = [f"ENSG{i}" for i in range(6)]
    adata.write_h5ad(path)
    return adata


@pytest.fixture
def local_norman(tmp_path, manifest_folder):
    """norman2019's manifest pointed at a local zip in GEARS' layout (norman/perturb_processed.h5ad)."""
    _gears_h5ad(tmp_path / "perturb_processed.h5ad")
    archive = tmp_path / "norman.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.write(tmp_path / "perturb_processed.h5ad", "norman/perturb_processed.h5ad")
    m = yaml.safe_load((manifest_folder / "norman2019.yaml").read_text())
    m["files"][0]["url"] = archive.as_uri()
    (manifest_folder / "norman2019.yaml").write_text(yaml.safe_dump(m))
    return archive


def test_norman_loader_pins_checksum_on_first_fetch(local_norman, caplog):
    with caplog.at_level("WARNING", logger="cape"):
        adata = cape.data.load("norman2019")
    assert "no sha256 in the manifest" in caplog.text and "pinned" in caplog.text
    assert list(adata.var_names) == ["A", "B", "C", "D", "E", "F"]
    assert set(adata.obs["condition"]) == {"ctrl", "A+ctrl", "A+B"}
    pin = cape.data.cache_dir() / "norman2019" / "perturb_processed.h5ad.sha256"
    assert pin.read_text().strip() == hashlib.sha256(
        (cape.data.cache_dir() / "norman2019" / "perturb_processed.h5ad").read_bytes()).hexdigest()
    # A corrupted cache file no longer matches the pinned checksum: it is fetched again.
    cached = cape.data.cache_dir() / "norman2019" / "perturb_processed.h5ad"
    cached.write_bytes(b"garbage")
    assert cape.data.load("norman2019").n_obs == 40


def test_gears_loader_rejects_bad_conditions(tmp_path, manifest_folder):
    adata = _gears_h5ad(tmp_path / "p.h5ad")
    adata.obs["condition"] = pd.Categorical(["ctrl"] * 20 + ["A_B"] * 20)
    adata.write_h5ad(tmp_path / "p.h5ad")
    m = yaml.safe_load((manifest_folder / "norman2019.yaml").read_text())
    m["files"][0] = {"role": "data", "url": (tmp_path / "p.h5ad").as_uri(), "sha256": None}
    (manifest_folder / "norman2019.yaml").write_text(yaml.safe_dump(m))
    with pytest.raises(CapeInputError, match="not in GEARS format .*A_B"):
        cape.data.load("norman2019")


def test_download_failure_is_one_line(tmp_path, manifest_folder):
    m = yaml.safe_load((manifest_folder / "norman2019.yaml").read_text())
    m["files"][0]["url"] = (tmp_path / "missing.zip").as_uri()
    (manifest_folder / "norman2019.yaml").write_text(yaml.safe_dump(m))
    with pytest.raises(CapeInputError, match="could not download file://"):
        cape.data.fetch("norman2019")
    assert not list((cape.data.cache_dir() / "norman2019").glob("*")) if (
        cape.data.cache_dir() / "norman2019").exists() else True
