"""GEARS (Roohani et al. 2023) with given gene embeddings, as the CAPE paper did (Sec. 5.2: gene representations
"fed into GEARS"), scored by cape's own top-20-DE MSE.

:func:`run_gears` builds GEARS' ``PertData`` from GEARS-format AnnData (``obs["condition"]``: ``ctrl`` / ``A+ctrl``
/ ``A+B``), uses GEARS' own "simulation" split (seed 1), trains GEARS and scores its mean prediction for every test
perturbation with :meth:`cape.tasks.perturbation.PerturbationTask.evaluate` — the same metric as ``cape-bench
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
import logging
import pickle
import random
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

from .._errors import CapeInputError
from .._options import with_options
from .._settings import resolve_device
from .gears_inputs import (
    DAG_GO_NOTE,
    GENE2GO_FILE,
    _gears_output_to_log,
    _gears_side_effects_contained,
    _import_gears,
    _read_go_graph,
    embedding_tables,
    go_edge_list,
)
from .perturbation import (
    CONTROL,
    PerturbationSplit,
    PerturbationTask,
    condition_genes,
    condition_means,
    downstream_de,
    simulation_split,
    top_de_genes,
    top_de_mse,
    validate_perturbation_data,
)
from .perturbation_predictors import (
    _torch_threads,
)

logger = logging.getLogger("cape")


GEARS_DIR = "cape_gears"  # GEARS' data_path inside workdir (rebuilt by every run)


@dataclass(frozen=True)
class GearsConfig:
    """GEARS' split, network and training in :func:`run_gears` (defaults: GEARS' own), and cape's score.

    Attributes
    ----------
    split_seed
        Seed of GEARS' "simulation" split (1, as in GEARS and the paper).
    epochs, hidden_size, batch_size, lr, weight_decay
        GEARS' training (20 epochs, width 64, lr 1e-3 halved every epoch, weight decay 5e-4; the best epoch by
        validation top-20-DE MSE is kept, as GEARS does).
    trainable_embeddings
        ``False`` (default): given embeddings stay fixed; ``True``: GEARS fine-tunes them.
    num_similar_genes
        k of GEARS' GO and co-expression graphs (20).
    n_de
        Differentially expressed genes per condition in cape's top-DE MSE (20).
    """

    split_seed: int = 1
    epochs: int = 20
    hidden_size: int = 64
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 5e-4
    trainable_embeddings: bool = False
    num_similar_genes: int = 20
    n_de: int = 20

    def __post_init__(self) -> None:
        for name in ("epochs", "hidden_size", "batch_size", "num_similar_genes", "n_de"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CapeInputError(f"GEARS' {name} must be a positive integer, got {value!r}")
        if not (self.lr > 0 and self.weight_decay >= 0):
            raise CapeInputError(f"GEARS' lr must be > 0 and weight_decay ≥ 0, got {self.lr}, {self.weight_decay}")


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


def run_gears(adata: ad.AnnData, gene_embeddings: np.ndarray | None = None, config: GearsConfig | None = None, *,
              go_graph=None, dag_key: str = "cape_dag", device: str | None = "auto", seed: int = 0,
              workdir: str | Path | None = None, allow_download: bool = False, condition_key: str = "condition",
              control: str = CONTROL, num_threads: int | None = 1, **options) -> dict:
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
    config
        GEARS' split, network and training and the score's ``n_de`` (:class:`GearsConfig`; default: GEARS' own).
    device, seed
        ``"auto"`` = CUDA when present. ``seed`` seeds GEARS' control-cell pairing, initialisation and batches.
    workdir
        Folder for GEARS' files: ``<workdir>/cape_gears`` (processed data, splits, graphs; rebuilt by every call),
        ``go_dag.csv`` (a DAG replacement of GO, in GEARS' format) and a downloaded ``gene2go_all.pkl``, which
        later calls reuse. A temporary folder by default.
    num_threads
        torch intra-op threads during the run (1; ``None`` leaves torch's setting).
    **options
        Fields of :class:`GearsConfig` by name (e.g. ``epochs=5``), replacing those of ``config``.

    Returns
    -------
    dict with ``predicted`` (test conditions × genes, GEARS' mean prediction over each condition's test cells, each
    paired with a random control cell as GEARS does), ``per_condition`` (top-``n_de``-DE MSE), ``metrics``
    (``mse_overall``, ``mse_single``, ``mse_double``, ``mse_combo_seen0/1/2`` as in ``cape-bench encodings``, and
    the diagnostic ``mse_overall_excl_targets`` of :func:`mse_excluding_targets`), ``split`` (GEARS' split as a
    :class:`~cape.tasks.perturbation.PerturbationSplit`), ``split_matches_cape`` (whether it equals
    :func:`~cape.tasks.perturbation.simulation_split`), ``go_graph`` (what replaced or supplied GO),
    ``n_go_edges``, ``embedding_rows`` (how many ``gene_emb``/``pert_emb`` rows were initialised),
    ``best_val_top20_de_mse`` (GEARS' own validation score of the kept epoch), ``model`` (the trained
    ``gears.GEARS`` object; its files in ``workdir`` are gone when ``workdir`` was temporary), ``seconds`` and
    ``params``.
    """
    config = with_options(GearsConfig, config, options, "run_gears")
    conditions = validate_perturbation_data(adata, condition_key=condition_key, control=control)
    genes = [str(g) for g in adata.var_names]
    gene_embeddings = _checked_embeddings(gene_embeddings, adata.n_vars)
    gears = _import_gears()
    dev = str(resolve_device(device))
    start = time.perf_counter()
    with _gears_workdir(workdir) as workdir:
        gene2go, edges, go_note = _gears_graph(go_graph, adata, conditions, dag_key, workdir, allow_download,
                                               config.num_similar_genes)
        with _gears_running(num_threads) as log:
            out = _train_and_predict(gears, _gears_input(adata, conditions, condition_key, control), gene2go,
                                     edges, gene_embeddings, genes, config, workdir=workdir, device=dev,
                                     seed=seed)
        train_log = log.getvalue()
    split = out["split"]
    predicted = out["predicted"].rename(index={"ctrl": control})
    per_condition, metrics = _score_predictions(adata, predicted, split, condition_key, control, config.n_de)
    return {"predicted": predicted, "per_condition": per_condition, "metrics": metrics, "split": split,
            "split_matches_cape": _same_split(split, simulation_split(conditions, seed=config.split_seed)),
            "go_graph": go_note, "n_go_edges": len(edges),
            "embedding_rows": out["embedding_rows"], "best_val_top20_de_mse": _best_val(train_log),
            "model": out["model"],
            "seconds": time.perf_counter() - start,
            "params": {"split": "simulation", **{k: v for k, v in asdict(config).items() if k != "n_de"},
                       "device": dev, "seed": seed, "gene_embeddings": None if gene_embeddings is None
                       else list(gene_embeddings.shape), "gears_version": _gears_version()}}


def train_gears(adata: ad.AnnData, train: Sequence[str], val: Sequence[str], config: GearsConfig | None = None, *,
                go_graph=None, device: str | None = "auto", seed: int = 0,
                workdir: str | Path | None = None, allow_download: bool = False, condition_key: str = "condition",
                control: str = CONTROL, num_threads: int | None = 1, **options) -> dict:
    """Train plain GEARS on the control cells and the perturbations ``train`` of ``adata``, keeping the epoch with
    the lowest top-20-DE MSE on the perturbations ``val``; no other cell reaches it. :func:`predict_gears` then
    predicts any condition whose genes are in GEARS' perturbation graph.

    Parameters
    ----------
    adata
        Log-scale expression with ``obs[condition_key]`` in GEARS format (cells of other conditions are ignored).
    train, val
        GEARS-format conditions to train on and to pick the epoch with (disjoint, control excluded).
    config, go_graph, device, seed, workdir, allow_download, num_threads, **options
        As in :func:`run_gears` (``config.split_seed`` is unused: the split is given; ``go_graph="dag"`` reads
        ``varp["cape_dag"]``).

    Returns
    -------
    dict with ``model`` (the trained ``gears.GEARS``), ``control`` (the control cells, sparse, for
    :func:`predict_gears`), ``cells`` (the ``obs_names`` GEARS read), ``go_graph`` (what replaced or supplied GO),
    ``n_go_edges``, ``best_val_top20_de_mse``, ``device`` and ``seconds``.
    """
    config = with_options(GearsConfig, config, options, "train_gears")
    labels = adata.obs[condition_key].astype(str)
    data = adata[labels.isin({control, *map(str, train), *map(str, val)}).to_numpy()]
    kept = set(validate_perturbation_data(data, condition_key=condition_key, control=control))
    train = list(dict.fromkeys(c for c in map(str, train) if c in kept))
    val = list(dict.fromkeys(c for c in map(str, val) if c in kept))
    if not train or not val or set(train) & set(val):
        raise CapeInputError(f"GEARS needs disjoint training and validation perturbations with cells: got "
                             f"{len(train)} and {len(val)}{', sharing conditions' if set(train) & set(val) else ''}")
    gears = _import_gears()
    dev = str(resolve_device(device))
    start = time.perf_counter()
    gdata = _gears_input(data, [*train, *val], condition_key, control)
    control_cells = gdata[(gdata.obs["condition"] == "ctrl").to_numpy()].copy()
    with _gears_workdir(workdir) as workdir:
        gene2go, edges, go_note = _gears_graph(go_graph, data, [*train, *val], "cape_dag", workdir, allow_download,
                                               config.num_similar_genes)
        with _gears_running(num_threads) as log:
            model, _, _ = _gears_model(gears, gdata, gene2go, edges, None, list(gdata.var_names), config,
                                       workdir=workdir, device=dev, seed=seed, split=(train, val))
    return {"model": model, "control": control_cells, "cells": list(map(str, gdata.obs_names)),
            "go_graph": go_note, "n_go_edges": len(edges), "best_val_top20_de_mse": _best_val(log.getvalue()),
            "device": dev, "seconds": time.perf_counter() - start}


def predict_gears(trained: dict, conditions: Sequence[str], *, n_cells: int = 300, seed: int = 0,
                  num_threads: int | None = 1) -> pd.DataFrame:
    """GEARS' predicted mean expression of each GEARS-format condition (conditions × genes), over the same
    ``n_cells`` control cells drawn with ``seed`` (without replacement where there are enough; GEARS' own
    ``predict`` draws 300 with replacement, anew per condition). ``trained`` comes from :func:`train_gears`; a
    condition naming a gene outside GEARS' perturbation graph is refused in one line."""
    from gears.utils import create_cell_graph_for_prediction  # optional dependency (extra `gears`)
    from torch_geometric.loader import DataLoader  # optional dependency (extra `gears`)

    model, control, device = trained["model"], trained["control"], trained["device"]
    index = {str(g): i for i, g in enumerate(model.pert_list)}
    outside = sorted({g for c in conditions for g in condition_genes(c) if g not in index})
    if outside:
        raise CapeInputError(f"GEARS cannot predict perturbations of {len(outside)} gene(s) outside its "
                             f"perturbation (GO) graph: {', '.join(outside[:10])}")
    rng = np.random.default_rng(seed)
    drawn = rng.choice(control.n_obs, n_cells, replace=control.n_obs < n_cells)
    x = np.asarray(sp.csr_matrix(control.X)[drawn].toarray(), dtype=np.float32)
    net = model.best_model.to(device).eval()
    rows = []
    with _gears_running(num_threads), torch.no_grad():
        for condition in conditions:
            genes = condition_genes(condition)
            pert_idx = [index[g] for g in genes]
            graphs = [create_cell_graph_for_prediction(cell, pert_idx, genes) for cell in x]
            total = sum(net(batch.to(device)).sum(dim=0).cpu().numpy().astype(np.float64)
                        for batch in DataLoader(graphs, batch_size=300, shuffle=False))
            rows.append(total / len(graphs))
    return pd.DataFrame(np.vstack(rows) if rows else np.zeros((0, control.n_vars)), index=list(conditions),
                        columns=[str(g) for g in control.var_names])


@contextlib.contextmanager
def _gears_workdir(workdir: str | Path | None):
    """``workdir`` as a created folder, or a temporary one removed on exit."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="cape_gears_") as tmp:
            yield Path(tmp)
        return
    path = Path(workdir)
    path.mkdir(parents=True, exist_ok=True)
    yield path


@contextlib.contextmanager
def _gears_running(num_threads: int | None):
    """GEARS' global side effects contained, torch's threads at ``num_threads``, its prints collected for the log
    (yielded) and its warnings (deprecated torch_geometric / pandas idioms) silenced."""
    with (_gears_side_effects_contained(), _torch_threads(num_threads), _gears_output_to_log() as log,
          warnings.catch_warnings()):
        warnings.simplefilter("ignore")
        yield log


def _checked_embeddings(gene_embeddings, n_vars: int) -> np.ndarray | None:
    """``gene_embeddings`` as float64 genes × d, refused in one line when misshaped or not finite."""
    if gene_embeddings is None:
        return None
    gene_embeddings = np.asarray(gene_embeddings, dtype=np.float64)
    if gene_embeddings.ndim != 2 or gene_embeddings.shape[0] != n_vars:
        raise CapeInputError(f"gene embeddings must be genes × d with {n_vars} rows, got shape "
                             f"{gene_embeddings.shape}")
    if not np.isfinite(gene_embeddings).all():
        raise CapeInputError("gene embeddings contain NaN or infinite values")
    return gene_embeddings


def _gears_graph(go_graph, adata: ad.AnnData, conditions, dag_key: str, workdir: Path, allow_download: bool,
                 k: int) -> tuple[dict, pd.DataFrame, str]:
    """GEARS' gene → GO map, its k-nearest GO edge list and a note on where they came from; every perturbed gene
    must be in the map (GEARS embeds a perturbation through it)."""
    gene2go, edges, go_note = _read_go_graph(go_graph, adata, dag_key, workdir, allow_download, k)
    perturbed = sorted({g for c in conditions for g in condition_genes(c)})
    absent = [g for g in perturbed if g not in gene2go]
    if absent:
        raise CapeInputError(f"{len(absent)} perturbed gene(s) are not in the GO graph, so GEARS cannot embed "
                             f"their perturbation: {', '.join(absent[:20])}")
    if edges is None:
        edges = go_edge_list(gene2go, sorted(gene2go), k=k)
    if go_note.startswith("dag"):
        edges.to_csv(workdir / "go_dag.csv", index=False)  # the replacement graph, in GEARS' go.csv format
        logger.debug("GEARS: %s", DAG_GO_NOTE)
    return gene2go, edges, go_note


def _score_predictions(adata: ad.AnnData, predicted: pd.DataFrame, split, condition_key: str, control: str,
                       n_de: int) -> tuple[pd.DataFrame, dict]:
    """Top-``n_de``-DE scores of GEARS' test predictions, as ``cape-bench encodings`` scores its predictors."""
    de = top_de_genes(adata, split.test, condition_key=condition_key, control=control, n_genes=n_de)
    truth = condition_means(adata, split.test, condition_key=condition_key)
    task = PerturbationTask(adata, split, de, truth, split.train + split.val, condition_key, control)
    _, per_condition, metrics = task.evaluate(_FixedPredictions(predicted))
    metrics["mse_overall_excl_targets"] = mse_excluding_targets(predicted, task)
    return per_condition, metrics


def _same_split(split, reference) -> bool:
    """Whether GEARS' split equals cape's :func:`~cape.tasks.perturbation.simulation_split`."""
    return bool(sorted(reference.test) == sorted(split.test) and reference.subgroup == split.subgroup
                and sorted(reference.train + reference.val) == sorted(split.train + split.val))


def _train_and_predict(gears, gdata: ad.AnnData, gene2go: dict, edges: pd.DataFrame, embeddings, genes,
                       config: GearsConfig, *, workdir: Path, device: str, seed: int) -> dict:
    """GEARS trained on its own simulation split of ``gdata``, its mean prediction of every test condition (each
    test cell paired with a random control cell, as GEARS evaluates) and the split."""
    from gears.inference import evaluate  # optional dependency (extra `gears`)

    model, pert_data, rows = _gears_model(gears, gdata, gene2go, edges, embeddings, genes, config,
                                          workdir=workdir, device=device, seed=seed)
    sets = pert_data.set2conditions
    res = evaluate(model.dataloader["test_loader"], model.best_model, False, device)
    gene_list = [str(g) for g in pert_data.adata.var["gene_name"]]
    pred = pd.DataFrame(res["pred"], columns=gene_list)
    pred["_condition"] = res["pert_cat"]
    predicted = pred.groupby("_condition", sort=True).mean().astype(np.float64)
    predicted.columns = genes
    subgroup = {c: g for g, conds in pert_data.subgroup["test_subgroup"].items() for c in conds}
    split = PerturbationSplit(train=[c for c in sets["train"] if c != "ctrl"], val=list(sets["val"]),
                              test=[c for c in sets["test"]], subgroup=subgroup,
                              params={"split": "simulation (GEARS' DataSplitter)", "seed": config.split_seed})
    return {"predicted": predicted, "split": split, "embedding_rows": rows, "model": model}


def _gears_model(gears, gdata: ad.AnnData, gene2go: dict, edges: pd.DataFrame, embeddings, genes,
                 config: GearsConfig, *, workdir: Path, device: str, seed: int,
                 split: tuple[Sequence[str], Sequence[str]] | None = None) -> tuple[object, object, dict]:
    """GEARS built on ``gdata`` and trained, the best epoch by validation kept: (``gears.GEARS``, its
    ``PertData``, the embedding rows initialised). ``split``: ``None`` = GEARS' simulation split (seed
    ``config.split_seed``), else (train, val) conditions, control added to train and no test set."""
    from gears.utils import GeneSimNetwork, get_similarity_network  # optional dependency (extra `gears`)

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
    if split is None:
        pert_data.prepare_split(split="simulation", seed=config.split_seed)
    else:  # GEARS' custom split: a pickled {train, val, test} dict
        with (gears_dir / "split.pkl").open("wb") as fh:
            pickle.dump({"train": ["ctrl", *split[0]], "val": list(split[1]), "test": []}, fh)
        pert_data.prepare_split(split="custom", seed=config.split_seed, split_dict_path=str(gears_dir / "split.pkl"))
    sets = pert_data.set2conditions
    if not sets.get("val") or (split is None and not sets.get("test")):
        raise CapeInputError("GEARS' simulation split left no validation or no test perturbation; more "
                             "perturbations are needed")
    k, hidden_size = config.num_similar_genes, config.hidden_size
    pert_data.get_dataloader(batch_size=config.batch_size, test_batch_size=max(config.batch_size, 128))
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
        net.gene_emb.weight.requires_grad_(config.trainable_embeddings)
        net.pert_emb.weight.requires_grad_(config.trainable_embeddings)
        rows = {"gene_emb": len(gene_table), "pert_emb": int(has.sum())}
    # GEARS.train tests on its test loader after training (and runs analyses that need its own metric); without
    # the loader it stops after keeping the best-validation model, and cape scores the test set itself
    test_loader = model.dataloader.pop("test_loader")
    torch.manual_seed(seed)
    try:
        model.train(epochs=config.epochs, lr=config.lr, weight_decay=config.weight_decay)
    finally:
        model.dataloader["test_loader"] = test_loader
    return model, pert_data, rows


def mse_excluding_targets(predicted: pd.DataFrame, task) -> float:
    """Top-DE MSE averaged over ``task``'s test perturbations, with each perturbation's own genes left out of its
    DE list: the downstream effects only.

    A diagnostic for GEARS: its loss skips genes whose mean is exactly 0 under a perturbation (a filter meant for
    dropouts), so on simulated ``do(gene = 0)`` knockouts it is never told that the knocked-out gene itself drops
    to 0 — usually the largest DE effect.
    """

    return float(top_de_mse(predicted.loc[list(task.truth.index)], task.truth, downstream_de(task.de)).mean())


def _best_val(log: str) -> float:
    """Lowest validation top-20-DE MSE GEARS printed (the epoch it kept); NaN when none was printed."""

    values = [float(v) for v in re.findall(r"Validation Top 20 DE MSE: ([-+]?\d+\.\d+|nan)", log)]
    return min(values) if values else float("nan")


def _gears_version() -> str:
    try:
        return version("cell-gears")
    except PackageNotFoundError:
        return "unknown"
