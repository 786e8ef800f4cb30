"""Dataset loaders: turn the verified files of a manifest into an AnnData. One function per ``loader:`` name."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import scanpy as sc
import scipy.sparse as sp

from .._errors import CapeInputError
from .gaussian_bn import read_gaussian_bn
from .manifest import Manifest
from .user_files import validate_adata

Loader = Callable[[dict[str, Path], Manifest], ad.AnnData]
LOADERS: dict[str, Loader] = {}
#: Loaders whose X may hold small negative values (simulated expression with noise), so validation allows them.
_SIGNED: set[str] = set()

#: Sachs et al. (2005): the 9 condition files stacked in cyto_full_data.csv, in file order, with row counts and the
#: usual intervention targets (None = observational or a general stimulation).
SACHS_CONDITIONS: tuple[tuple[str, int, str | None], ...] = (
    ("cd3cd28", 853, None),
    ("cd3cd28+icam2", 902, None),
    ("cd3cd28+aktinhib", 911, "pakts473"),
    ("cd3cd28+g0076", 723, "PKC"),
    ("cd3cd28+psitect", 810, "PIP2"),
    ("cd3cd28+u0126", 799, "pmek"),
    ("cd3cd28+ly", 848, "PIP3"),
    ("pma", 913, "PKC"),
    ("b2camp", 707, "PKA"),
)
SACHS_OBSERVATIONAL = ("cd3cd28", "cd3cd28+icam2")


def loader(name: str, *, nonnegative: bool = True) -> Callable[[Loader], Loader]:
    def register(fn: Loader) -> Loader:
        LOADERS[name] = fn
        if not nonnegative:
            _SIGNED.add(name)
        return fn

    return register


def edges_to_adjacency(edges: pd.DataFrame, genes: pd.Index, weight: str | None = "weight") -> sp.csr_matrix:
    """Sparse genes×genes adjacency with ``A[i, j] = w`` for an edge i → j (``source``/``target`` columns)."""
    missing = sorted(set(edges["source"]).union(edges["target"]) - set(genes))
    if missing:
        raise CapeInputError(f"graph names genes absent from the data: {', '.join(missing)}")
    rows = genes.get_indexer(edges["source"])
    cols = genes.get_indexer(edges["target"])
    vals = edges[weight].to_numpy(float) if weight else np.ones(len(edges))
    return sp.csr_matrix((vals, (rows, cols)), shape=(len(genes), len(genes)))


@loader("pbmc68k_reduced")
def _pbmc68k_reduced(files: dict[str, Path], manifest: Manifest) -> ad.AnnData:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scanpy's file predates anndata's current layout: format warnings only
        full = ad.read_h5ad(files["data"])
    # X is scaled; .raw holds the log-normalised expression of the same genes, which is what cape needs.
    adata = ad.AnnData(
        X=sp.csr_matrix(full.raw.X, dtype=np.float32),
        obs=full.obs.copy(),
        var=pd.DataFrame(index=full.raw.var_names.copy()),
        obsm={k: np.asarray(v) for k, v in full.obsm.items()},
    )
    adata.var["highly_variable"] = full.var["highly_variable"].reindex(adata.var_names).fillna(False).astype(bool)
    adata.uns["log1p"] = {"base": None}  # scanpy's marker: tells cape.pp.preprocess not to normalise again
    for key in ("bulk_labels_colors", "louvain_colors"):
        if key in full.uns:
            adata.uns[key] = full.uns[key]
    return adata


def parse_krumsiek11_network(path: Path) -> pd.DataFrame:
    """Signed edges (source regulates target) from the coupling list of scanpy's ``sim_models/krumsiek11.txt``."""
    text = path.read_text()
    if "# coupling list:" not in text:
        raise CapeInputError(f"{path}: no '# coupling list:' section")
    rows = []
    for line in text.split("# coupling list:", 1)[1].strip().splitlines():
        parts = line.split()
        if len(parts) != 3 or line.lstrip().startswith("#"):
            continue
        target, source, weight = parts
        rows.append((source, target, float(weight)))
    return pd.DataFrame(rows, columns=["source", "target", "weight"])


@loader("krumsiek11", nonnegative=False)  # simulated values dip slightly below 0
def _krumsiek11(files: dict[str, Path], manifest: Manifest) -> ad.AnnData:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # scanpy warns about its duplicated cell names
        adata = sc.read_text(files["data"], first_column_names=True)
    # Fate labels of scanpy.datasets.krumsiek11: progenitors, then 80 cells of each fate at the end of each branch.
    cell_type = np.array(["progenitor"] * adata.n_obs, dtype=object)
    for start, label in ((80, "Mo"), (240, "Ery"), (400, "Mk"), (560, "Neu")):
        cell_type[start : start + 80] = label
    adata.obs["cell_type"] = pd.Categorical(cell_type, categories=["progenitor", "Mo", "Ery", "Mk", "Neu"])
    adata.obs_names_make_unique()
    edges = parse_krumsiek11_network(files["graph"])
    self_loops = edges["source"] == edges["target"]
    adata.varp["true_graph"] = edges_to_adjacency(edges[~self_loops], adata.var_names)
    adata.uns["true_graph_edges"] = edges.astype({"weight": float})
    return adata


@loader("sachs2005")
def _sachs2005(files: dict[str, Path], manifest: Manifest) -> ad.AnnData:
    frame = pd.read_csv(files["data"])
    sizes = [n for _, n, _ in SACHS_CONDITIONS]
    if len(frame) != sum(sizes):
        raise CapeInputError(f"{files['data']}: expected {sum(sizes)} rows (9 stacked conditions), got {len(frame)}")
    adata = ad.AnnData(X=frame.to_numpy(np.float32), var=pd.DataFrame(index=frame.columns.astype(str)))
    adata.obs_names = [f"cell{i}" for i in range(adata.n_obs)]
    condition = np.repeat([c for c, _, _ in SACHS_CONDITIONS], sizes)
    target = np.repeat([t or "none" for _, _, t in SACHS_CONDITIONS], sizes)
    adata.obs["condition"] = pd.Categorical(condition, categories=[c for c, _, _ in SACHS_CONDITIONS])
    adata.obs["target"] = pd.Categorical(target)
    adata.obs["observational"] = np.isin(condition, SACHS_OBSERVATIONAL)
    edges = pd.read_csv(files["graph"]).rename(columns={"Cause": "source", "Effect": "target"})
    adata.varp["true_graph"] = edges_to_adjacency(edges, adata.var_names, weight=None)
    adata.uns["true_graph_edges"] = edges
    return adata


@loader("gaussian_bn", nonnegative=False)
def _gaussian_bn(files: dict[str, Path], manifest: Manifest) -> ad.AnnData:
    """A bnlearn linear Gaussian network, sampled as its manifest describes (see :mod:`cape.data.gaussian_bn`)."""
    bn = read_gaussian_bn(files["network"], name=manifest.name)
    return bn.simulate(n_control=2000, knockdowns=min(10, bn.n_genes), cells_per_knockdown=100, seed=0)


_GEARS_CONDITION = re.compile(r"^[^+]+\+[^+]+$")


@loader("gears")
def gears(files: dict[str, Path], manifest: Manifest) -> ad.AnnData:
    """GEARS' processed Perturb-seq format (``perturb_processed.h5ad``): ``obs["condition"]`` is ``"ctrl"``,
    ``"A+ctrl"`` or ``"A+B"``; gene symbols in ``var["gene_name"]`` become the var names."""
    adata = ad.read_h5ad(files["data"])
    if "condition" not in adata.obs:
        raise CapeInputError(f"{files['data']}: GEARS format needs obs['condition'] ('ctrl', 'A+ctrl', 'A+B')")
    conditions = adata.obs["condition"].astype(str)
    bad = sorted({c for c in conditions.unique() if c != "ctrl" and not _GEARS_CONDITION.match(c)})
    if bad:
        raise CapeInputError(f"{files['data']}: conditions not in GEARS format ('ctrl', 'A+ctrl', 'A+B'): "
                             f"{', '.join(bad[:5])} (cape.tasks.to_gears_conditions converts other spellings)")
    if "ctrl" not in set(conditions):
        raise CapeInputError(f"{files['data']}: no control cells (condition 'ctrl')")
    if "gene_name" in adata.var:
        adata.var_names = adata.var["gene_name"].astype(str).to_numpy()
    adata.uns.setdefault("log1p", {"base": None})  # GEARS stores log-normalised expression
    return adata


def build(files: dict[str, Path], manifest: Manifest) -> ad.AnnData:
    """Run the manifest's loader and validate the result."""
    if manifest.loader not in LOADERS:
        raise CapeInputError(f"{manifest.name}: unknown loader {manifest.loader!r}; known: {', '.join(LOADERS)}")
    adata = LOADERS[manifest.loader](files, manifest)
    return validate_adata(adata, source=manifest.name, expect_counts=manifest.loader not in _SIGNED)
from . import loaders_remote  # noqa: E402,F401  (registers the loaders of the internet datasets)
