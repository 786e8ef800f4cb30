"""GEARS' gene-gene graphs and embedding tables, built offline: the GO graph from a gene2go pickle, an edge list
or a replacement from the causal DAG (Jaccard index of closed DAG neighbourhoods), and gene embeddings brought to
the width and norm GEARS' tables take; and GEARS' import, with its global side effects contained. See
:mod:`cape.tasks.gears`."""

from __future__ import annotations

import contextlib
import io
import logging
import pickle
import random
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import scanpy as sc
import scipy.sparse as sp
import torch

from .._errors import CapeInputError

logger = logging.getLogger("cape")

GO_JACCARD_THRESHOLD = 0.1  # GEARS: an edge when the Jaccard index of two genes' GO-term sets exceeds 0.1


GENE2GO_FILE = "gene2go_all.pkl"  # the file name PertData.__init__ reads (and downloads when missing)


DAG_GO_NOTE = ("GO graph replaced by the Jaccard index of DAG neighbourhoods (gene, parents, children): "
               "not the paper's GEARS, which uses Gene Ontology")


# ----------------------------------------------------------------------------------------------------------------
# GO graph: GEARS' files, or a DAG-neighbourhood replacement
# ----------------------------------------------------------------------------------------------------------------
def dag_gene2go(adjacency, gene_names: Sequence[str]) -> dict[str, set[str]]:
    """A gene2go-like dict from a gene graph: each gene's "terms" are its closed neighbourhood (itself, its parents
    and its children, by name), so the Jaccard index of two entries is that of the genes' DAG neighbourhoods.

    ``adjacency[i, j] != 0`` means i → j (direction is irrelevant here).
    """
    a = sp.csr_matrix(adjacency)
    n = len(gene_names)
    if a.shape != (n, n):
        raise CapeInputError(f"gene graph has shape {a.shape}, expected {n} × {n} (one row per gene)")
    und = ((a != 0) + (a != 0).T).tocsr()
    names = [str(g) for g in gene_names]
    return {names[i]: {names[i], *(names[j] for j in und.indices[und.indptr[i]:und.indptr[i + 1]])}
            for i in range(n)}


def go_edge_list(gene2go: Mapping[str, set], genes: Sequence[str] | None = None, *, k: int = 20,
                 threshold: float = GO_JACCARD_THRESHOLD) -> pd.DataFrame:
    """GEARS' perturbation-similarity graph from gene → term sets, as a ``source,target,importance`` edge list.

    The same graph as GEARS' ``make_GO`` + ``get_similarity_network``: importance = Jaccard index of the two term
    sets, kept when above ``threshold`` (self-pairs included, importance 1), then for every target its ``k + 1``
    strongest incoming edges. Computed with sparse matrix products instead of GEARS' quadratic Python loop;
    ``genes`` restricts the graph (default: every key). Rows are sorted by target, then importance (descending),
    then source, so the output is deterministic.
    """
    names = [str(g) for g in (gene2go if genes is None else genes)]
    missing = [g for g in names if g not in gene2go]
    if missing:
        raise CapeInputError(f"{len(missing)} gene(s) without GO entry: {', '.join(missing[:10])}")
    terms = sorted({t for g in names for t in gene2go[g]}, key=str)
    col = {t: i for i, t in enumerate(terms)}
    rows = np.repeat(np.arange(len(names)), [len(gene2go[g]) for g in names])
    cols = np.fromiter((col[t] for g in names for t in gene2go[g]), dtype=np.int64, count=len(rows))
    m = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(terms)))
    inter = (m @ m.T).tocoo()
    size = np.asarray(m.sum(axis=1)).ravel()
    union = size[inter.row] + size[inter.col] - inter.data
    score = np.divide(inter.data, union, out=np.zeros_like(inter.data), where=union > 0)
    keep = score > threshold
    frame = pd.DataFrame({"source": np.asarray(names, dtype=object)[inter.row[keep]],
                          "target": np.asarray(names, dtype=object)[inter.col[keep]],
                          "importance": score[keep]})
    frame = frame.sort_values(["target", "importance", "source"], ascending=[True, False, True], kind="stable")
    return frame.groupby("target", sort=False).head(k + 1).reset_index(drop=True)


def _read_go_graph(go_graph, adata: ad.AnnData, dag_key: str, workdir: Path, allow_download: bool, k: int
                   ) -> tuple[dict[str, set], pd.DataFrame | None, str]:
    """(gene2go for PertData, GO edge list or None = build from gene2go, description)."""
    genes = [str(g) for g in adata.var_names]
    if isinstance(go_graph, str) and go_graph == "dag":
        if dag_key not in adata.varp:
            raise CapeInputError(f"go_graph='dag' needs a gene graph in varp[{dag_key!r}]; run Step I "
                                 "(cape.tl.causal_graph) or pass the adjacency matrix as go_graph")
        return dag_gene2go(adata.varp[dag_key], genes), None, f"dag:varp[{dag_key}] — {DAG_GO_NOTE}"
    if go_graph is not None and not isinstance(go_graph, (str, Path)):
        return dag_gene2go(go_graph, genes), None, f"dag:given adjacency — {DAG_GO_NOTE}"
    if go_graph is None:
        cached = workdir / GENE2GO_FILE
        if not cached.exists():
            if not allow_download:
                raise CapeInputError(
                    "GEARS needs a GO graph and cape does not download it: pass go_graph=<gene2go_all.pkl> (GEARS' "
                    "gene→GO-terms pickle, Harvard Dataverse file 6153417) or <go.csv> (columns source,target,"
                    "importance), or go_graph='dag' for a DAG-neighbourhood graph that replaces GO")
            _download_gene2go(cached)
        go_graph = cached
    path = Path(go_graph)
    if not path.is_file():
        raise CapeInputError(f"GO graph file not found: {path}")
    if path.suffix == ".csv":
        try:
            edges = pd.read_csv(path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
            raise CapeInputError(f"cannot read GO edge list {path}: {err}") from None
        need = {"source", "target", "importance"}
        if not need <= set(edges.columns):
            raise CapeInputError(f"GO edge list {path} needs columns source,target,importance; has "
                                 f"{','.join(map(str, edges.columns))}")
        edges = edges[["source", "target", "importance"]].astype({"source": str, "target": str})
        edges["importance"] = pd.to_numeric(edges["importance"], errors="coerce")
        if not np.isfinite(edges["importance"].to_numpy(float)).all():
            raise CapeInputError(f"GO edge list {path} has non-numeric or non-finite importance values")
        edges = (edges.sort_values(["target", "importance", "source"], ascending=[True, False, True], kind="stable")
                 .groupby("target", sort=False).head(k + 1).reset_index(drop=True))
        # PertData only needs the keys (which genes can be perturbed); the edges are handed to GEARS directly
        nodes = set(edges["source"]) | set(edges["target"])
        return {g: {g} for g in sorted(nodes)}, edges, f"go_csv:{path}"
    try:
        with path.open("rb") as fh:
            gene2go = pickle.load(fh)
    except (pickle.UnpicklingError, EOFError, ValueError, AttributeError, ImportError) as err:
        raise CapeInputError(f"cannot read gene2go pickle {path}: {err}") from None
    if not isinstance(gene2go, Mapping):
        raise CapeInputError(f"gene2go pickle {path} holds a {type(gene2go).__name__}, not a gene → GO terms dict")
    wanted = set(genes)
    return {str(g): set(t) for g, t in gene2go.items() if str(g) in wanted}, None, f"gene2go:{path}"


def _download_gene2go(target: Path) -> None:
    """GEARS' own downloader (Harvard Dataverse), only when the caller allowed it."""
    from gears.utils import dataverse_download  # optional dependency (extra `gears`)

    try:
        with _gears_side_effects_contained(), _gears_output_to_log():
            dataverse_download("https://dataverse.harvard.edu/api/access/datafile/6153417", str(target))
    except OSError as err:  # requests' ConnectionError is an OSError
        target.unlink(missing_ok=True)
        raise CapeInputError(f"could not download GEARS' gene2go_all.pkl ({type(err).__name__}); pass a local "
                             "copy as go_graph") from None


# ----------------------------------------------------------------------------------------------------------------
# embeddings → GEARS' tables
# ----------------------------------------------------------------------------------------------------------------
def fit_embedding_width(embeddings: np.ndarray, width: int) -> np.ndarray:
    """Genes × d → genes × ``width``, scaled so that the longest row has norm 1 − 1e-6.

    d ≤ width: zero padding. d > width: projection on the top ``width`` right singular vectors of the uncentred
    matrix (the best rank-``width`` linear map, keeping the origin). One common scale factor keeps relative norms
    and angles, and stays inside GEARS' ``max_norm=1`` so that GEARS never renormalises a row.
    """
    emb = np.asarray(embeddings, dtype=np.float64)
    if emb.shape[1] <= width:
        out = np.zeros((emb.shape[0], width))
        out[:, :emb.shape[1]] = emb
    else:
        _, _, vt = np.linalg.svd(emb, full_matrices=False)
        out = emb @ vt[:width].T
    longest = np.linalg.norm(out, axis=1).max(initial=0.0)
    return out * ((1.0 - 1e-6) / longest) if longest > 0 else out


def embedding_tables(embeddings: np.ndarray, gene_names: Sequence[str], gene_list: Sequence[str],
                     pert_list: Sequence[str], width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GEARS ``gene_emb`` rows (``gene_list`` order) and ``pert_emb`` rows (``pert_list`` order) from embeddings
    whose rows follow ``gene_names``; returns (gene table, pert table, mask of pert rows that got an embedding)."""
    table = fit_embedding_width(embeddings, width)
    index = {str(g): i for i, g in enumerate(gene_names)}
    gene_rows = [index[str(g)] for g in gene_list]
    has = np.array([str(p) in index for p in pert_list], dtype=bool)
    pert = np.zeros((len(pert_list), width))
    pert[has] = table[[index[str(p)] for p, h in zip(pert_list, has, strict=True) if h]]
    return table[gene_rows], pert, has


# ----------------------------------------------------------------------------------------------------------------
# containment of GEARS' global side effects
# ----------------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _gears_side_effects_contained():
    """Restore warnings filters, scanpy's verbosity and the Python/NumPy/torch random states on exit."""

    verbosity = sc.settings.verbosity
    # GEARS draws from NumPy's legacy global generator, so that is the state to save
    py_state, np_state = random.getstate(), np.random.get_state()  # noqa: NPY002
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            sc.settings.verbosity = verbosity
            random.setstate(py_state)
            np.random.set_state(np_state)  # noqa: NPY002


@contextlib.contextmanager
def _gears_output_to_log():
    """GEARS prints progress to stdout/stderr; collect it and pass it to the cape logger at debug level."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield buffer
    finally:
        text = buffer.getvalue().strip()
        if text:
            logger.debug("GEARS output:\n%s", text)


def _import_gears():
    try:
        with _gears_side_effects_contained():
            import gears  # optional dependency (extra `gears`)
            import gears.inference  # optional dependency (extra `gears`)
            import gears.utils  # optional dependency (extra `gears`)
    except ImportError as err:
        raise CapeInputError(f"GEARS is not installed ({err}); pip install 'cape-sc[gears]' "
                             "(cell-gears and torch_geometric)") from None
    return gears
