"""Loaders for the paper's datasets that need the internet (Supp. D.2): registered with ``@loader`` and used by the
manifests in ``data_manifests/`` (``zheng68k``, ``segerstolpe_pancreas``, ``scope2_specht``, ``pscope_leduc``).

Each loader reads the raw formats the original authors publish, so it can be tested on a small local file of the
same format (see ``tests/test_data_loaders_remote.py``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.io import mmread
from sklearn.impute import KNNImputer

from .._errors import CapeInputError
from .loaders import loader
from .manifest import Manifest

logger = logging.getLogger("cape")


# ----------------------------------------------------------------------------------------------------------------
# hPBMC: Zheng et al. (2017) fresh 68k PBMCs, 10x matrix market files + the authors' cell-type annotation
# ----------------------------------------------------------------------------------------------------------------
@loader("tenx_mtx_annotated")
def tenx_mtx_annotated(files: dict[str, Path], manifest: Manifest) -> ad.AnnData:
    """10x Genomics v1 matrix (``matrix.mtx`` genes × cells, ``genes.tsv``, ``barcodes.tsv``) plus an annotation
    table (``labels`` role: tab-separated with a ``barcodes`` column and a ``celltype`` column, as in Zheng et al.'s
    ``68k_pbmc_barcodes_annotation.tsv``). Gene symbols become the var names (``var["gene_ids"]`` keeps Ensembl);
    ``obs["cell_type"]`` holds the labels; cells without a label are dropped (logged)."""

    for role in ("data", "genes", "barcodes", "labels"):
        if role not in files:
            raise CapeInputError(f"{manifest.name}: manifest needs a file with role {role!r}")
    counts = sp.csr_matrix(mmread(str(files["data"])).T, dtype=np.float32)  # mtx is genes × cells
    genes = pd.read_csv(files["genes"], sep="\t", header=None, dtype=str)
    barcodes = pd.read_csv(files["barcodes"], sep="\t", header=None, dtype=str)[0].to_numpy()
    if counts.shape != (len(barcodes), len(genes)):
        raise CapeInputError(f"{manifest.name}: matrix is {counts.shape[1]} genes × {counts.shape[0]} cells but "
                             f"genes.tsv has {len(genes)} rows and barcodes.tsv {len(barcodes)}")
    symbols = genes[1] if genes.shape[1] > 1 else genes[0]
    adata = ad.AnnData(X=counts, obs=pd.DataFrame(index=barcodes),
                       var=pd.DataFrame({"gene_ids": genes[0].to_numpy()}, index=symbols.to_numpy()))
    labels = pd.read_csv(files["labels"], sep="\t", dtype=str)
    for col in ("barcodes", "celltype"):
        if col not in labels:
            raise CapeInputError(f"{manifest.name}: annotation table lacks a {col!r} column "
                                 f"(has {', '.join(labels.columns)})")
    label_of = labels.set_index("barcodes")["celltype"]
    if not label_of.index.is_unique:
        raise CapeInputError(f"{manifest.name}: annotation table lists a barcode twice")
    known = adata.obs_names.isin(label_of.index)
    if not known.any():
        raise CapeInputError(f"{manifest.name}: no barcode of the matrix appears in the annotation table")
    if not known.all():
        logger.warning("%s: %d cells without a label dropped", manifest.name, int((~known).sum()))
        adata = adata[known].copy()
    adata.obs["cell_type"] = pd.Categorical(label_of.reindex(adata.obs_names).to_numpy())
    adata.layers["counts"] = adata.X.copy()
    return adata


# ----------------------------------------------------------------------------------------------------------------
# hPancreas: Segerstolpe et al. (2016), Smart-seq2, E-MTAB-5061
# ----------------------------------------------------------------------------------------------------------------
def _sdrf_column(sdrf: pd.DataFrame, words: str) -> str | None:
    """The ``Characteristics[...]`` column whose name contains ``words`` (case- and space-insensitive)."""
    want = words.replace(" ", "").lower()
    for col in sdrf.columns:
        if want in col.replace(" ", "").lower():
            return col
    return None


@loader("segerstolpe_pancreas")
def segerstolpe_pancreas(files: dict[str, Path], manifest: Manifest) -> ad.AnnData:
    """Segerstolpe et al. (2016) human islets: ``pancreas_refseq_rpkms_counts_3514sc.txt`` (header ``#samples``
    then the cell names; each row a gene symbol, a RefSeq id, the RPKMs of all cells, then the read counts of all
    cells) and the ArrayExpress ``sdrf`` sample table. Read counts become ``X`` (and ``layers["counts"]``); cells
    the authors flagged as low quality are dropped (2,209 of 3,514 cells remain); ``obs`` gets ``cell_type``,
    ``donor`` and ``disease``; duplicate gene symbols are summed."""
    path = files["data"]
    with open(path) as fh:
        header = fh.readline().rstrip("\n").split("\t")
    if not header or header[0] != "#samples":
        raise CapeInputError(f"{manifest.name}: {path.name} does not start with '#samples'")
    cells = [c for c in header[1:] if c]
    n = len(cells)
    table = pd.read_csv(path, sep="\t", header=None, skiprows=1)
    if table.shape[1] != 2 + 2 * n:
        raise CapeInputError(f"{manifest.name}: expected 2 + 2×{n} columns (gene, RefSeq, RPKMs, counts), "
                             f"got {table.shape[1]}")
    counts = table.iloc[:, 2 + n:].to_numpy(np.float32)
    symbols = table[0].astype(str).to_numpy()
    frame = pd.DataFrame(counts, index=symbols).groupby(level=0, sort=False).sum()
    adata = ad.AnnData(X=sp.csr_matrix(frame.to_numpy().T), obs=pd.DataFrame(index=cells),
                       var=pd.DataFrame(index=frame.index.astype(str)))
    sdrf = pd.read_csv(files["meta"], sep="\t", dtype=str)
    cols = {key: _sdrf_column(sdrf, words) for key, words in (
        ("cell_type", "cell type"), ("donor", "individual"), ("disease", "disease"),
        ("quality", "single cell well quality"))}
    if cols["cell_type"] is None or "Source Name" not in sdrf:
        raise CapeInputError(f"{manifest.name}: sample table lacks 'Source Name' or a cell type column")
    meta = sdrf.drop_duplicates("Source Name").set_index("Source Name")
    missing = [c for c in cells if c not in meta.index]
    if missing:
        raise CapeInputError(f"{manifest.name}: {len(missing)} cells missing from the sample table, e.g. {missing[0]}")
    meta = meta.loc[cells]
    for key, col in cols.items():
        if col is not None and key != "quality":
            adata.obs[key] = pd.Categorical(meta[col].to_numpy())
    if cols["quality"] is not None:
        ok = (meta[cols["quality"]].str.strip().str.upper() == "OK").to_numpy()
        logger.info("%s: %d of %d cells pass the authors' quality flag", manifest.name, int(ok.sum()), len(ok))
        adata = adata[ok].copy()
    adata.layers["counts"] = adata.X.copy()
    return adata


# ----------------------------------------------------------------------------------------------------------------
# single-cell proteomics: SCoPE2 (Specht et al. 2021), pSCoPE (Leduc et al. 2022)
# ----------------------------------------------------------------------------------------------------------------
#: Slavov lab's Cells.csv codes for the SCoPE2 cell types.
SCOPE2_CELL_TYPES = {"sc_m0": "macrophage", "sc_u": "monocyte"}
_LABEL_FIELDS = ("cell_type", "celltype", "CellType", "cell type")


def _cell_annotation(cells: pd.DataFrame, cell_ids: pd.Index, name: str) -> pd.DataFrame:
    """Annotation with one row per cell, whichever way the file is laid out (cells as rows or as columns)."""
    cells = cells.copy()
    cells.index = cells.index.astype(str)
    cells.columns = cells.columns.astype(str)
    if cell_ids.isin(cells.index).sum() >= cell_ids.isin(cells.columns).sum():
        by_cell = cells
    else:
        by_cell = cells.T
    hits = cell_ids.isin(by_cell.index)
    if not hits.any():
        raise CapeInputError(f"{name}: no cell of the data matrix appears in the cell annotation")
    return by_cell


@loader("scp_csv", nonnegative=False)  # log-ratios: negative values are normal
def scp_csv(files: dict[str, Path], manifest: Manifest) -> ad.AnnData:
    """Single-cell proteomics tables: ``data`` CSV with features as rows and cells as columns, led by a protein
    column (and optionally a peptide column), ``NA`` for missing values; ``cells`` CSV with the annotation (cells as
    rows or as columns; a ``cell_type``/``celltype`` field gives ``obs["cell_type"]``).

    Peptide rows are summarised per protein by their median; proteins seen in fewer than 10 % of cells are dropped
    and the remaining gaps are filled by KNN imputation (k = 3), following the SCoPE2 pipeline (Supp. F.1.2). The
    fraction of observed values is stored in ``uns["scp"]``; ``layers["observed"]`` marks measured entries.
    """

    table = pd.read_csv(files["data"], low_memory=False)
    numeric = [c for c in table.columns if pd.api.types.is_numeric_dtype(table[c])]
    ids = [c for c in table.columns if c not in numeric]
    if not ids or not numeric:
        raise CapeInputError(f"{manifest.name}: data CSV needs a protein column followed by numeric cell columns")
    protein = table[ids[0]].astype(str)
    values = table[numeric].astype(np.float64)
    values.index = protein.to_numpy()
    by_protein = values.groupby(level=0, sort=False).median()  # peptide → protein
    x = by_protein.to_numpy().T  # cells × proteins
    cell_ids = pd.Index([str(c) for c in numeric])
    observed = ~np.isnan(x)
    keep = observed.mean(axis=0) >= 0.1
    if not keep.any():
        raise CapeInputError(f"{manifest.name}: no protein is measured in at least 10% of cells")
    x, observed = x[:, keep], observed[:, keep]
    if not observed.all():
        x = KNNImputer(n_neighbors=3).fit_transform(x)
    adata = ad.AnnData(X=x.astype(np.float32), obs=pd.DataFrame(index=cell_ids),
                       var=pd.DataFrame(index=by_protein.index[keep].astype(str)))
    adata.layers["observed"] = observed.astype(np.uint8)
    adata.uns["scp"] = {"observed_fraction": float(observed.mean()), "imputation": "KNN k=3",
                        "min_detection": 0.1}
    annotation = _cell_annotation(pd.read_csv(files["cells"], index_col=0, dtype=str), cell_ids, manifest.name)
    known = cell_ids.isin(annotation.index)
    if not known.all():
        logger.warning("%s: %d cells without annotation dropped", manifest.name, int((~known).sum()))
        adata = adata[known].copy()
    meta = annotation.loc[adata.obs_names]
    label = next((f for f in _LABEL_FIELDS if f in meta.columns), None)
    if label is None:
        raise CapeInputError(f"{manifest.name}: cell annotation has no cell type field ({', '.join(_LABEL_FIELDS)})")
    for col in meta.columns:
        if col != label:
            adata.obs[str(col)] = meta[col].to_numpy()
    adata.obs["cell_type"] = pd.Categorical(meta[label].map(lambda v: SCOPE2_CELL_TYPES.get(v, v)).to_numpy())
    return adata
