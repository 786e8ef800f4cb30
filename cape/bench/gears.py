"""GEARS (Roohani et al. 2023) with given gene embeddings, as the CAPE paper did (Sec. 5.2: gene representations
"fed into GEARS"), scored by cape's own top-20-DE MSE.

:func:`run_gears` builds GEARS' ``PertData`` from GEARS-format AnnData (``obs["condition"]``: ``ctrl`` / ``A+ctrl``
/ ``A+B``), uses GEARS' own "simulation" split (seed 1), trains GEARS and scores its mean prediction for every test
perturbation with :meth:`cape.tasks.perturbation.PerturbationTask.evaluate` — the same metric as ``cape bench
encodings --task perturbation`` (overall, singles, doubles, and doubles with 0/1/2 genes seen).

**Gene embeddings.** ``gene_embeddings`` (genes × d, rows in ``var_names`` order) initialise GEARS' gene-embedding
table ``gene_emb`` and, for every gene that has a row there, its perturbation-embedding table ``pert_emb``
(:func:`embedding_tables`). Width d is brought to ``hidden_size`` by zero padding (d ≤ hidden) or by projection on
the top ``hidden_size`` right singular vectors of the (uncentred) matrix (d > hidden); both keep the origin and
inner products up to the dropped components. The matrix is then scaled by one common factor so that the longest
row has norm 1 − 1e-6: GEARS' tables have ``max_norm=1`` and would otherwise rescale every longer row to norm 1 on
first lookup, erasing relative norms (for CAPE's Poincaré coordinates, the norm is the gene's causal generality).
The tables are **frozen by default** (``trainable_embeddings=False``): the paper evaluates the representations
themselves, and Supp. E.1 describes them as the *input* of the downstream predictor; the trainable option lets GEARS
fine-tune them. ``gene_embeddings=None`` is plain GEARS (its random, trainable tables).

**GO graph, offline.** GEARS downloads ``gene2go_all.pkl`` (gene → GO terms) in ``PertData.__init__`` and builds
its perturbation-similarity graph from it (Jaccard index of GO-term sets > 0.1, each gene's 20 most similar genes
plus itself). This module never downloads unless ``allow_download=True`` (then GEARS' own downloader fetches the
file into ``workdir``). ``go_graph`` may be

* a ``.pkl`` path: GEARS' gene2go dict pickle (e.g. a local copy of ``gene2go_all.pkl``);
* a ``.csv`` path: a ready edge list with GEARS' columns ``source,target,importance``;
* ``"dag"`` (or a genes × genes adjacency): **a replacement for GO**, the Jaccard index of closed DAG
  neighbourhoods (gene, parents, children; ``adata.varp[dag_key]``), run through the same threshold and top-k as
  GEARS' GO graph (:func:`dag_gene2go`, :func:`go_edge_list`). This is *not* the paper's GEARS; outputs say so.

**Compatibility with current libraries** (applied only inside :func:`run_gears`, GEARS' code itself untouched):
GEARS 0.1.2 indexes its sparse ``X`` with a pandas Series in ``GEARS.__init__`` (current scipy refuses), so its
co-expression graph is built first by GEARS' own ``get_similarity_network`` on the sparse matrix and GEARS then gets
a dense ``X``; GEARS' ``make_GO`` writes into ``./data`` of the working directory and starts 25 processes, so the GO
graph is computed here and handed over through ``model_initialize(G_go=...)``; importing GEARS silences every warning
of the process, sets scanpy's verbosity and reseeds torch, so warnings filters, scanpy verbosity and the Python,
NumPy and torch random states are restored afterwards; GEARS' prints and progress bars go to the ``cape`` logger
(debug level). GEARS still reads ``Series[0]`` positionally, which pandas ≥ 3 no longer allows (pandas 2.x works).
"""

from __future__ import annotations

import contextlib
import io
import logging
import pickle
import random
import shutil
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

from .._errors import CapeInputError
from ..tasks.perturbation import (
    CONTROL,
    PerturbationSplit,
    PerturbationTask,
    condition_genes,
    condition_means,
    simulation_split,
    top_de_genes,
    top_de_mse,
    validate_perturbation_data,
)
from ..tasks.perturbation_predictors import (
    AdditivePredictor,
    NoChangePredictor,
    _torch_threads,
    pca_gene_embeddings,
    random_gene_embeddings,
)

logger = logging.getLogger("cape")

GO_JACCARD_THRESHOLD = 0.1  # GEARS: an edge when the Jaccard index of two genes' GO-term sets exceeds 0.1
GENE2GO_FILE = "gene2go_all.pkl"  # the file name PertData.__init__ reads (and downloads when missing)
GEARS_DIR = "cape_gears"  # GEARS' data_path inside workdir (rebuilt by every run)
DAG_GO_NOTE = ("GO graph replaced by the Jaccard index of DAG neighbourhoods (gene, parents, children): "
               "not the paper's GEARS, which uses Gene Ontology")


def gears_available() -> bool:
    """Whether the optional GEARS dependencies (``pip install 'cape[gears]'``) import."""
    try:
        with _gears_side_effects_contained():
            import gears  # noqa: F401
            import torch_geometric  # noqa: F401
    except ImportError:
        return False
    return True


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
    from gears.utils import dataverse_download

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
    import scanpy as sc
    import torch

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
            import gears
            import gears.inference
            import gears.utils
    except ImportError as err:
        raise CapeInputError(f"GEARS is not installed ({err}); pip install 'cape[gears]' "
                             "(cell-gears and torch_geometric)") from None
    return gears


# ----------------------------------------------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------------------------------------------
class _FixedPredictions:
    """Predictions made elsewhere, in the predictor interface :class:`PerturbationTask` scores."""

    name = "gears"

    def __init__(self, predicted: pd.DataFrame) -> None:
        self.predicted = predicted

    def fit(self, *args, **kwargs) -> _FixedPredictions:
        return self

    def predict(self, conditions: Sequence[str]) -> pd.DataFrame:
        return self.predicted.loc[list(conditions)]


def _gears_input(adata: ad.AnnData, conditions: Sequence[str], condition_key: str, control: str) -> ad.AnnData:
    """The AnnData GEARS processes: sparse float32 X, ``condition`` / ``cell_type`` / ``gene_name`` only."""
    labels = adata.obs[condition_key].astype(str)
    keep = labels.isin(set(conditions) | {control}).to_numpy()
    x = adata.X[keep]
    x = sp.csr_matrix(x, dtype=np.float32)
    cell_type = (adata.obs["cell_type"].astype(str).to_numpy()[keep] if "cell_type" in adata.obs
                 else np.full(int(keep.sum()), "cell"))
    obs = pd.DataFrame({"condition": labels.to_numpy()[keep].astype(str), "cell_type": cell_type},
                       index=adata.obs_names[keep].astype(str))
    obs["condition"] = obs["condition"].replace({control: "ctrl"})  # GEARS' control label is fixed
    names = adata.var_names.astype(str)
    return ad.AnnData(X=x, obs=obs, var=pd.DataFrame({"gene_name": names.to_numpy()}, index=names))


def run_gears(adata: ad.AnnData, gene_embeddings: np.ndarray | None = None, *, go_graph=None,
              dag_key: str = "cape_dag", split_seed: int = 1, epochs: int = 20, hidden_size: int = 64,
              batch_size: int = 32, lr: float = 1e-3, weight_decay: float = 5e-4,
              trainable_embeddings: bool = False, num_similar_genes: int = 20, device: str | None = "auto",
              seed: int = 0, workdir: str | Path | None = None, allow_download: bool = False,
              condition_key: str = "condition", control: str = CONTROL, n_de: int = 20,
              num_threads: int | None = 1) -> dict:
    """Train GEARS on GEARS-format ``adata`` (optionally with given gene embeddings) and score its test predictions.

    Parameters
    ----------
    adata
        Log-scale expression with ``obs[condition_key]`` in GEARS format; ``obs["cell_type"]`` is used when present.
        Every perturbed gene must be in ``var_names``.
    gene_embeddings
        Genes × d array, rows in ``var_names`` order, or ``None`` for plain GEARS. Initialises ``gene_emb`` and
        ``pert_emb`` (see the module docstring for the width map and scaling).
    go_graph
        GEARS' gene2go ``.pkl``, a ``.csv`` edge list (``source,target,importance``), ``"dag"`` (the graph in
        ``varp[dag_key]``) or a genes × genes adjacency — the last two replace GO. ``None``: ``workdir`` must hold
        ``gene2go_all.pkl`` or ``allow_download`` must be set, else a :class:`cape.CapeInputError` says what to
        provide.
    split_seed
        Seed of GEARS' "simulation" split (1, as in GEARS and the paper).
    epochs, hidden_size, batch_size, lr, weight_decay
        GEARS' training (defaults: GEARS' 20 epochs, width 64, lr 1e-3 halved every epoch, weight decay 5e-4;
        the best epoch by validation top-20-DE MSE is kept, as GEARS does).
    trainable_embeddings
        ``False`` (default): given embeddings stay fixed; ``True``: GEARS fine-tunes them.
    num_similar_genes
        k of GEARS' GO and co-expression graphs (20).
    device, seed
        ``"auto"`` = CUDA when present. ``seed`` seeds GEARS' control-cell pairing, initialisation and batches.
    workdir
        Folder for GEARS' files: ``<workdir>/cape_gears`` (processed data, splits, graphs; rebuilt by every call),
        ``go_dag.csv`` (a DAG replacement of GO, in GEARS' format) and a downloaded ``gene2go_all.pkl``, which
        later calls reuse. A temporary folder by default.
    num_threads
        torch intra-op threads during the run (1; ``None`` leaves torch's setting).

    Returns
    -------
    dict with ``predicted`` (test conditions × genes, GEARS' mean prediction over each condition's test cells, each
    paired with a random control cell as GEARS does), ``per_condition`` (top-``n_de``-DE MSE), ``metrics``
    (``mse_overall``, ``mse_single``, ``mse_double``, ``mse_combo_seen0/1/2`` as in ``cape bench encodings``, and
    the diagnostic ``mse_overall_excl_targets`` of :func:`mse_excluding_targets`), ``split`` (GEARS' split as a
    :class:`~cape.tasks.perturbation.PerturbationSplit`), ``split_matches_cape`` (whether it equals
    :func:`~cape.tasks.perturbation.simulation_split`), ``go_graph`` (what replaced or supplied GO),
    ``n_go_edges``, ``embedding_rows`` (how many ``gene_emb``/``pert_emb`` rows were initialised),
    ``best_val_top20_de_mse`` (GEARS' own validation score of the kept epoch), ``model`` (the trained
    ``gears.GEARS`` object; its files in ``workdir`` are gone when ``workdir`` was temporary), ``seconds`` and
    ``params``.
    """
    from .._settings import resolve_device

    conditions = validate_perturbation_data(adata, condition_key=condition_key, control=control)
    genes = [str(g) for g in adata.var_names]
    if gene_embeddings is not None:
        gene_embeddings = np.asarray(gene_embeddings, dtype=np.float64)
        if gene_embeddings.ndim != 2 or gene_embeddings.shape[0] != adata.n_vars:
            raise CapeInputError(f"gene embeddings must be genes × d with {adata.n_vars} rows, got shape "
                                 f"{gene_embeddings.shape}")
        if not np.isfinite(gene_embeddings).all():
            raise CapeInputError("gene embeddings contain NaN or infinite values")
    if epochs < 1 or hidden_size < 1 or batch_size < 1:
        raise CapeInputError("epochs, hidden_size and batch_size must be positive")
    gears = _import_gears()
    dev = str(resolve_device(device))
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="cape_gears_"))
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        gene2go, edges, go_note = _read_go_graph(go_graph, adata, dag_key, workdir, allow_download,
                                                 num_similar_genes)
        perturbed = sorted({g for c in conditions for g in condition_genes(c)})
        absent = [g for g in perturbed if g not in gene2go]
        if absent:
            raise CapeInputError(f"{len(absent)} perturbed gene(s) are not in the GO graph, so GEARS cannot embed "
                                 f"their perturbation: {', '.join(absent[:20])}")
        if edges is None:
            edges = go_edge_list(gene2go, sorted(gene2go), k=num_similar_genes)
        if go_note.startswith("dag"):
            edges.to_csv(workdir / "go_dag.csv", index=False)  # the replacement graph, in GEARS' go.csv format
            logger.debug("GEARS: %s", DAG_GO_NOTE)
        with (_gears_side_effects_contained(), _torch_threads(num_threads), _gears_output_to_log() as log,
              warnings.catch_warnings()):
            warnings.simplefilter("ignore")  # GEARS' deprecated torch_geometric / pandas idioms
            out = _train_and_predict(gears, _gears_input(adata, conditions, condition_key, control), gene2go,
                                     edges, gene_embeddings, genes, workdir=workdir, split_seed=split_seed,
                                     epochs=epochs, hidden_size=hidden_size, batch_size=batch_size, lr=lr,
                                     weight_decay=weight_decay, trainable=trainable_embeddings,
                                     k=num_similar_genes, device=dev, seed=seed)
        train_log = log.getvalue()
    split = out["split"]
    predicted = out["predicted"].rename(index={"ctrl": control})
    cape_split = simulation_split(conditions, seed=split_seed)
    matches = (sorted(cape_split.test) == sorted(split.test) and cape_split.subgroup == split.subgroup
               and sorted(cape_split.train + cape_split.val) == sorted(split.train + split.val))
    de = top_de_genes(adata, split.test, condition_key=condition_key, control=control, n_genes=n_de)
    truth = condition_means(adata, split.test, condition_key=condition_key)
    task = PerturbationTask(adata, split, de, truth, split.train + split.val, condition_key, control)
    _, per_condition, metrics = task.evaluate(_FixedPredictions(predicted))
    metrics["mse_overall_excl_targets"] = mse_excluding_targets(predicted, task)
    return {"predicted": predicted, "per_condition": per_condition, "metrics": metrics, "split": split,
            "split_matches_cape": bool(matches), "go_graph": go_note, "n_go_edges": len(edges),
            "embedding_rows": out["embedding_rows"], "best_val_top20_de_mse": _best_val(train_log),
            "model": out["model"],
            "seconds": time.perf_counter() - start,
            "params": {"split": "simulation", "split_seed": split_seed, "epochs": epochs,
                       "hidden_size": hidden_size, "batch_size": batch_size, "lr": lr, "weight_decay": weight_decay,
                       "trainable_embeddings": trainable_embeddings, "num_similar_genes": num_similar_genes,
                       "device": dev, "seed": seed, "gene_embeddings": None if gene_embeddings is None
                       else list(gene_embeddings.shape), "gears_version": _gears_version()}}


def _train_and_predict(gears, gdata: ad.AnnData, gene2go: dict, edges: pd.DataFrame, embeddings, genes, *,
                       workdir: Path, split_seed: int, epochs: int, hidden_size: int, batch_size: int, lr: float,
                       weight_decay: float, trainable: bool, k: int, device: str, seed: int) -> dict:
    import torch
    from gears.inference import evaluate
    from gears.utils import GeneSimNetwork, get_similarity_network

    # GEARS' data_path: a folder of ours, rebuilt on every call, because GEARS reuses any split or co-expression
    # graph it finds there by file name, even when the data changed (a downloaded gene2go cache stays in workdir)
    gears_dir = workdir / GEARS_DIR
    shutil.rmtree(gears_dir, ignore_errors=True)
    gears_dir.mkdir(parents=True)
    with (gears_dir / GENE2GO_FILE).open("wb") as fh:
        pickle.dump(gene2go, fh)  # where PertData.__init__ looks, so it does not download
    random.seed(seed)
    # GEARS pairs each perturbed cell with a random control cell drawn from NumPy's legacy global generator
    np.random.seed(seed)  # noqa: NPY002
    torch.manual_seed(seed)
    pert_data = gears.PertData(str(gears_dir), default_pert_graph=False)
    pert_data.new_data_process("cape", adata=gdata)
    pert_data.prepare_split(split="simulation", seed=split_seed)
    sets = pert_data.set2conditions
    if not sets.get("val") or not sets.get("test"):
        raise CapeInputError("GEARS' simulation split left no validation or no test perturbation; more "
                             "perturbations are needed")
    pert_data.get_dataloader(batch_size=batch_size, test_batch_size=max(batch_size, 128))
    coexpress = get_similarity_network(network_type="co-express", adata=pert_data.adata, threshold=0.4, k=k,
                                       data_path=str(gears_dir), data_name=pert_data.dataset_name,
                                       split=pert_data.split, seed=pert_data.seed,
                                       train_gene_set_size=pert_data.train_gene_set_size, set2conditions=sets)
    gene_list = [str(g) for g in pert_data.adata.var["gene_name"]]
    coexpress_net = GeneSimNetwork(coexpress, gene_list, node_map={g: i for i, g in enumerate(gene_list)})
    pert_list = [str(p) for p in pert_data.pert_names]
    go_net = GeneSimNetwork(edges[edges["source"].isin(pert_list) & edges["target"].isin(pert_list)], pert_list,
                            node_map=pert_data.node_map_pert)
    # GEARS.__init__ indexes X with a pandas Series, which scipy sparse matrices refuse: GEARS gets dense X
    pert_data.adata.X = np.asarray(pert_data.adata.X.toarray(), dtype=np.float32)
    model = gears.GEARS(pert_data, device=device)
    torch.manual_seed(seed)
    model.model_initialize(hidden_size=hidden_size, num_similar_genes_go_graph=k,
                           num_similar_genes_co_express_graph=k, G_go=go_net.edge_index,
                           G_go_weight=go_net.edge_weight, G_coexpress=coexpress_net.edge_index,
                           G_coexpress_weight=coexpress_net.edge_weight)
    rows = {"gene_emb": 0, "pert_emb": 0}
    if embeddings is not None:
        gene_table, pert_table, has = embedding_tables(embeddings, genes, model.gene_list, model.pert_list,
                                                       hidden_size)
        net = model.model
        with torch.no_grad():
            net.gene_emb.weight.copy_(torch.as_tensor(gene_table, dtype=net.gene_emb.weight.dtype))
            net.pert_emb.weight[torch.as_tensor(has)] = torch.as_tensor(pert_table[has],
                                                                         dtype=net.pert_emb.weight.dtype)
        net.gene_emb.weight.requires_grad_(trainable)
        net.pert_emb.weight.requires_grad_(trainable)
        rows = {"gene_emb": len(gene_table), "pert_emb": int(has.sum())}
    # GEARS.train tests on its test loader after training (and runs analyses that need its own metric); without
    # the loader it stops after keeping the best-validation model, and cape scores the test set itself
    test_loader = model.dataloader.pop("test_loader")
    torch.manual_seed(seed)
    try:
        model.train(epochs=epochs, lr=lr, weight_decay=weight_decay)
    finally:
        model.dataloader["test_loader"] = test_loader
    res = evaluate(test_loader, model.best_model, False, device)
    pred = pd.DataFrame(res["pred"], columns=gene_list)
    pred["_condition"] = res["pert_cat"]
    predicted = pred.groupby("_condition", sort=True).mean().astype(np.float64)
    predicted.columns = genes
    subgroup = {c: g for g, conds in pert_data.subgroup["test_subgroup"].items() for c in conds}
    split = PerturbationSplit(train=[c for c in sets["train"] if c != "ctrl"], val=list(sets["val"]),
                              test=[c for c in sets["test"]], subgroup=subgroup,
                              params={"split": "simulation (GEARS' DataSplitter)", "seed": split_seed})
    return {"predicted": predicted, "split": split, "embedding_rows": rows, "model": model}


def mse_excluding_targets(predicted: pd.DataFrame, task) -> float:
    """Top-DE MSE averaged over ``task``'s test perturbations, with each perturbation's own genes left out of its
    DE list: the downstream effects only.

    A diagnostic for GEARS: its loss skips genes whose mean is exactly 0 under a perturbation (a filter meant for
    dropouts), so on simulated ``do(gene = 0)`` knockouts it is never told that the knocked-out gene itself drops
    to 0 — usually the largest DE effect.
    """

    de = {c: [g for g in genes if g not in condition_genes(c)] for c, genes in task.de.items()}
    return float(top_de_mse(predicted.loc[list(task.truth.index)], task.truth, de).mean())


def _best_val(log: str) -> float:
    """Lowest validation top-20-DE MSE GEARS printed (the epoch it kept); NaN when none was printed."""
    import re

    values = [float(v) for v in re.findall(r"Validation Top 20 DE MSE: ([-+]?\d+\.\d+|nan)", log)]
    return min(values) if values else float("nan")


def _gears_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cell-gears")
    except PackageNotFoundError:
        return "unknown"


# ----------------------------------------------------------------------------------------------------------------
# benchmark: plain GEARS vs GEARS fed CAPE's gene positions vs control embeddings
# ----------------------------------------------------------------------------------------------------------------
ARMS = ("plain", "cape", "pca", "random", "cape_oracle")
DEFAULT_ARMS = ("plain", "cape", "pca", "random")
ARM_NOTES = {
    "plain": "GEARS' own random, trainable gene and perturbation embeddings",
    "cape": "CAPE's Poincaré-ball gene positions (Steps I–III on the control cells)",
    "pca": "PCA gene loadings of the control cells (same width as CAPE's positions)",
    "random": "Gaussian random gene embeddings (same width; a new draw per seed)",
    "cape_oracle": ("Steps II–III run on the data's known DAG instead of Step I's (an upper reference for CAPE's "
                    "geometry, not a method: it needs the true graph)"),
}
METRICS = ("mse_overall", "mse_single", "mse_double", "mse_combo_seen0", "mse_combo_seen1", "mse_combo_seen2",
           "mse_overall_excl_targets")
KNOWN_GRAPH_KEYS = ("true_dag", "true_graph")  # simulate_perturbation, Sachs 2005 consensus network


def resolve_go_graph(choice, adata: ad.AnnData, cape_positions: ad.AnnData | None = None):
    """The ``go_graph`` argument for a benchmark choice: ``known`` (the dataset's known graph, ``varp["true_dag"]``
    or ``varp["true_graph"]``), ``cape_dag`` (Step I's learnt DAG), ``empty`` (no gene similarity: only self-loops,
    so unseen genes' perturbation embeddings get no help from a graph), or a GEARS ``.pkl`` / ``.csv`` path."""
    if choice == "known":
        key = next((k for k in KNOWN_GRAPH_KEYS if k in adata.varp), None)
        if key is None:
            raise CapeInputError("--go-graph known needs varp['true_dag'] or varp['true_graph'] in the data; "
                                 "choose cape_dag, empty or a GO file")
        return adata.varp[key], f"known graph varp[{key}]"
    if choice == "cape_dag":
        if cape_positions is None or "cape_dag" not in cape_positions.varp:
            raise CapeInputError("--go-graph cape_dag needs Step I's DAG: include the 'cape' arm")
        if list(cape_positions.var_names) != list(adata.var_names):
            raise CapeInputError("Step I's DAG and the perturbation data have different genes")
        return sp.csr_matrix(cape_positions.varp["cape_dag"]), "Step I DAG (cape_dag)"
    if choice == "empty":
        return sp.csr_matrix((adata.n_vars, adata.n_vars)), "empty graph (self-loops only)"
    path = Path(str(choice))
    if path.suffix not in (".pkl", ".csv"):
        raise CapeInputError(f"--go-graph must be known, cape_dag, empty or a .pkl/.csv GO file, got {choice!r}")
    return path, f"GO file {path.name}"


def run_gears_benchmark(adata: ad.AnnData, *, dataset: str = "data", arms: Sequence[str] = DEFAULT_ARMS,
                        seeds: Sequence[int] = (0, 1), quick: bool = False, epochs: int | None = None,
                        go_graph="known", trainable_embeddings: bool = False, positions_seed: int = 0,
                        out: str | Path | None = "results/bench", name: str | None = None, threads: int | None = 1,
                        device: str | None = "auto", settings_overrides: Mapping | None = None) -> dict:
    """Each arm × seed through :func:`run_gears` on the same data, GO graph and split; no-change and additive
    baselines in the same run. Writes ``<out>/<name>.{json,md,png}`` (``name`` = ``gears_<dataset>``).

    CAPE's positions come from :func:`cape.bench.encodings.position_sets` on the control cells (the same Steps I–III
    settings as ``cape bench encodings``, quick or full, changed by ``settings_overrides``, e.g. ``causal_tau``),
    once, shared by every seed. Returns ``{"records", "seconds", "cpu_seconds", "paths"}``.
    """
    import torch

    from .._io import write_json, write_text
    from .encodings import BenchSettings, position_sets, prepare_expression

    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise CapeInputError(f"unknown arm(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(ARMS)}")
    if not seeds:
        raise CapeInputError("at least one seed is needed")
    _import_gears()
    epochs = epochs or (5 if quick else 20)
    settings = BenchSettings.for_mode(quick, **dict(settings_overrides or {}))
    start, cpu_start = time.perf_counter(), time.process_time()
    data = prepare_expression(adata, settings.n_genes)
    task = PerturbationTask.build(data)
    base = {"task": "perturbation", "dataset": dataset}
    records: list[dict] = []
    for predictor in (NoChangePredictor(), AdditivePredictor()):
        predicted, _, scores = task.evaluate(predictor)
        scores["mse_overall_excl_targets"] = mse_excluding_targets(predicted, task)
        records += [{**base, "kind": "baseline", "arm": predictor.name, "seed": None, "metric": m, "value": v}
                    for m, v in scores.items()]
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        positions = None
        dim = settings.embed_dim
        if "cape" in arms or go_graph == "cape_dag":
            sets, timings = position_sets(task.control_cells, ["cape"], settings, seed=positions_seed, device=device)
            positions = sets["cape"]
            records += [{**base, "kind": "positions", "arm": "cape", "seed": positions_seed, **t} for t in timings]
        graph, graph_note = resolve_go_graph(go_graph, data, positions)
        fixed = {}
        if "cape" in arms:
            fixed["cape"] = pd.DataFrame(positions.varm["cape_poincare"], index=positions.var_names
                                         ).reindex(data.var_names).fillna(0.0).to_numpy()
        if "pca" in arms:
            fixed["pca"] = pca_gene_embeddings(data, n_comps=dim)
        if "cape_oracle" in arms:
            fixed["cape_oracle"] = _oracle_positions(data, task.control_cells, settings, positions_seed, device)
        go_note = None
        for arm in arms:
            for seed in seeds:
                emb = (None if arm == "plain" else random_gene_embeddings(data.n_vars, dim, seed=seed)
                       if arm == "random" else fixed[arm])
                res = run_gears(data, emb, go_graph=graph, epochs=epochs, trainable_embeddings=trainable_embeddings,
                                device=device, seed=seed, num_threads=None)
                go_note = res["go_graph"]
                if not res["split_matches_cape"]:
                    logger.warning("GEARS' split differs from cape's simulation_split reimplementation")
                logger.info("GEARS %s seed %d: %s (%.1f s)", arm, seed,
                            ", ".join(f"{k} {v:.4f}" for k, v in res["metrics"].items()), res["seconds"])
                records += [{**base, "kind": "gears", "arm": arm, "seed": seed, "metric": m, "value": v,
                             "epochs": epochs, "trainable_embeddings": trainable_embeddings,
                             "embedding_dim": None if emb is None else int(emb.shape[1]), "go_graph": graph_note,
                             "seconds": res["seconds"], "best_val_top20_de_mse": res["best_val_top20_de_mse"],
                             "split_matches_cape": res["split_matches_cape"]}
                            for m, v in res["metrics"].items()]
    finally:
        torch.set_num_threads(previous)
    seconds = time.perf_counter() - start
    result = {"records": records, "seconds": seconds, "cpu_seconds": time.process_time() - cpu_start, "paths": {}}
    if out is not None:
        import os
        import platform

        stem = Path(out) / (name or f"gears_{dataset}")
        stem.parent.mkdir(parents=True, exist_ok=True)
        info = {"n_cells": data.n_obs, "n_genes": data.n_vars, "seeds": list(seeds), "quick": quick, "epochs": epochs,
                "threads": threads, "cpu_count": len(os.sched_getaffinity(0)), "machine": platform.machine(),
                "load_average": os.getloadavg()[0], "go_graph": f"{graph_note} — {go_note}", "embed_dim": dim,
                "trainable_embeddings": trainable_embeddings, "split": task.split, "settings": settings}
        result["paths"] = {"json": write_json(records, stem.with_suffix(".json")),
                           "md": write_text(gears_markdown(result, dataset, info), stem.with_suffix(".md")),
                           "png": plot_gears(records, dataset, stem.with_suffix(".png"))}
    return result


def _oracle_positions(data: ad.AnnData, control: ad.AnnData, settings, seed: int, device) -> np.ndarray:
    """Poincaré positions of Steps II–III on the data's known DAG (``varp["true_dag"]`` / ``["true_graph"]``)."""
    from .. import tl

    key = next((k for k in KNOWN_GRAPH_KEYS if k in data.varp), None)
    if key is None:
        raise CapeInputError("arm cape_oracle needs the data's known graph in varp['true_dag'] or varp['true_graph']")
    pos = control.copy()
    tl.hyperbolic_embedding(pos, adjacency=sp.csr_matrix(data.varp[key]), geometry="hyperbolic", optimizer="rsgd",
                            dim=settings.embed_dim, epochs=settings.embed_epochs, device=device or "auto", seed=seed)
    return np.asarray(pos.varm["cape_poincare"], dtype=np.float64)


def gears_table(records: Sequence[dict], metrics: Sequence[str] = METRICS, digits: int = 3) -> str:
    """Markdown: one row per arm (and baseline), ``mean ± sd`` over seeds and, for GEARS arms, the difference to
    plain GEARS (lower MSE is better)."""
    frame = pd.DataFrame([r for r in records if r.get("kind") in ("gears", "baseline")])
    frame["value"] = frame["value"].astype(float)
    stats = frame.groupby(["kind", "arm", "metric"], sort=False)["value"].agg(["mean", "std", "count"])
    measured = [m for m in metrics if stats.xs(m, level="metric")["mean"].notna().any()]
    plain = stats.loc[("gears", "plain")]["mean"] if ("gears", "plain") in stats.index.droplevel(2) else None
    lines = ["| model | " + " | ".join(measured) + " |", "|---|" + "---|" * len(measured)]
    for kind, arm in dict.fromkeys(zip(frame["kind"], frame["arm"], strict=True)):
        cells = []
        for m in measured:
            if (kind, arm, m) not in stats.index or pd.isna(stats.loc[(kind, arm, m), "mean"]):
                cells.append("–")
                continue
            mean, sd, n = stats.loc[(kind, arm, m), ["mean", "std", "count"]]
            cell = f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if n > 1 and not pd.isna(sd) else "")
            if kind == "gears" and arm != "plain" and plain is not None and m in plain.index:
                cell += f" ({mean - plain[m]:+.{digits}f})"
            cells.append(cell)
        label = f"GEARS + {arm}" if kind == "gears" and arm != "plain" else ("GEARS" if kind == "gears" else arm)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gears_markdown(result: dict, dataset: str, info: dict) -> str:
    records = result["records"]
    arms = list(dict.fromkeys(r["arm"] for r in records if r.get("kind") == "gears"))
    split = info["split"]
    sizes = ", ".join(f"{g} {len(c)}" for g, c in split.test_by_subgroup().items())
    pos = [r for r in records if r.get("kind") == "positions"]
    parts = [f"# GEARS with CAPE gene embeddings: perturbation prediction on {dataset}", "",
             f"Top-20-DE MSE (lower is better), mean ± sd over seeds {', '.join(map(str, info['seeds']))}; in "
             "parentheses the difference to plain GEARS. Same data, split, GO graph and GEARS settings in every "
             "row; the metric is cape's (`cape bench encodings --task perturbation`).", "",
             gears_table(records), "",
             "Rows: " + "; ".join(f"{'GEARS' if a == 'plain' else 'GEARS + ' + a}: {ARM_NOTES[a]}" for a in arms)
             + f". Embeddings {'fine-tuned by GEARS' if info['trainable_embeddings'] else 'frozen'}, width "
             f"{info['embed_dim']} zero-padded to GEARS' 64 and scaled into its unit ball; they initialise "
             "`gene_emb` and `pert_emb`. no_change / additive: cape's baselines on the same split.", "",
             f"GO graph: {info['go_graph']}.", "",
             f"Split: GEARS' simulation split, seed 1 (identical to cape's reimplementation: "
             f"{all(r.get('split_matches_cape', True) for r in records if r.get('kind') == 'gears')}); "
             f"{len(split.train)} train, {len(split.val)} validation, {len(split.test)} test perturbations ({sizes}).",
             ""]
    if pos:
        s = info["settings"]
        parts += [f"CAPE positions (once, seed {pos[0]['seed']}; Step I {s.causal_epochs} epochs, rank "
                  f"{s.causal_rank}, τ {s.causal_tau}; Step II d {s.embed_dim}, {s.embed_epochs} epochs): " + "; ".join(
            f"{r['step']} {r['metric']} = " + (f"{r['value']:.1f}" if r["metric"] == "seconds"
                                               else f"{int(r['value'])}") for r in pos) + ".", ""]
        if any(r["metric"] == "n_edges" and r["value"] == 0 for r in pos):
            parts += ["**Step I kept no edge: every CAPE position is the origin, so GEARS + cape got all-zero "
                      "embeddings in this run (lower the threshold with --causal-tau).**", ""]
    parts += [f"Data: {info['n_cells']} cells × {info['n_genes']} genes. GEARS {info['epochs']} epochs "
              f"(best validation epoch kept). Wall time {result['seconds'] / 60:.1f} min (CPU time "
              f"{result['cpu_seconds'] / 60:.1f} min) on {info['cpu_count']} CPU core(s) ({info['machine']}, "
              f"{info['threads']} torch thread(s), 1-min load average at the end {info['load_average']:.1f})"
              + (" — quick mode." if info["quick"] else "."), ""]
    return "\n".join(parts)


def plot_gears(records: Sequence[dict], dataset: str, path: str | Path) -> Path:
    """Bars per arm (mean ± sd over seeds) for overall / single / double MSE and the overall MSE without the
    perturbed genes themselves; baselines as dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .._io import save_figure

    frame = pd.DataFrame([r for r in records if r.get("kind") in ("gears", "baseline")])
    frame["value"] = frame["value"].astype(float)
    shown = ("mse_overall", "mse_single", "mse_double", "mse_overall_excl_targets")
    metrics = [m for m in shown if frame.loc[frame["metric"] == m, "value"].notna().any()]
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.4 * len(metrics), 3.4), squeeze=False)
    gears_rows = frame[frame["kind"] == "gears"]
    arms = list(dict.fromkeys(gears_rows["arm"]))
    colors = {"plain": "tab:gray", "cape": "tab:red", "pca": "tab:blue", "random": "tab:olive",
              "cape_oracle": "tab:pink"}
    for ax, m in zip(axes[0], metrics, strict=True):
        stats = gears_rows[gears_rows["metric"] == m].groupby("arm", sort=False)["value"].agg(["mean", "std"])
        stats = stats.reindex(arms)
        ax.bar(range(len(arms)), stats["mean"], yerr=stats["std"].fillna(0), capsize=3,
               color=[colors.get(a, "tab:purple") for a in arms])
        for k, (arm, sub) in enumerate(frame[(frame["kind"] == "baseline") & (frame["metric"] == m)]
                                       .groupby("arm", sort=False)):
            ax.axhline(sub["value"].mean(), ls="--", lw=1, color=("black", "tab:green")[k % 2], label=arm)
        ax.set_xticks(range(len(arms)), ["GEARS" if a == "plain" else f"+{a}" for a in arms], rotation=30)
        ax.set_ylabel(f"{m} (↓)")
        ax.set_title(m, fontsize=9)
    axes[0][0].legend(fontsize=7, frameon=False, loc="lower left")
    fig.suptitle(f"GEARS on {dataset}: plain vs fed gene embeddings (top-20-DE MSE; dashed = baselines)",
                 fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return Path(path)
