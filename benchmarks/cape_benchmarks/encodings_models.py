"""The parts of ``cape-bench encodings`` that one model run needs: the variants (registry encodings and CAPE's
ablations), the settings of a quick or full run, the shared gene positions (Steps I–III, a correlation graph, a
Euclidean embedding), and one model trained and scored on one task. The runner is :mod:`cape_benchmarks.encodings`."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import scanpy as sc
import scipy.sparse as sp

from cape import encodings, tl
from cape._arrays import zscore_columns
from cape._errors import CapeInputError
from cape.encodings.cape import DEFAULT_BAND_TOP
from cape.models import CellTransformer
from cape.models.hyperparameters import DEFAULT_RECIPE
from cape.tasks.annotation import annotation_metrics, fine_tune_cells, roles
from cape.tasks.clustering import cluster_embedding
from cape.tasks.perturbation import PerturbationTask, condition_genes
from cape.tasks.perturbation_predictors import EmbeddingPerturbationPredictor

logger = logging.getLogger("cape")


TASKS = ("annotation", "clustering", "perturbation")


BACKBONES = ("scgpt", "scbert")


DEFAULT_ENCODING = {"scgpt": "trainable_absolute", "scbert": "static_absolute"}


# ablation name -> (registry encoding, position set[, control]); position sets are built by :func:`position_sets`,
# controls (:mod:`cape_benchmarks.encodings_controls`) are drawn from a set with the model's seed.
ABLATIONS = {
    "cape_null": ("none", "none"),
    "cape_wo_csl": ("cape", "correlation"),
    "cape_wo_hyperbolic": ("cape", "euclidean"),
    "cape_wo_rotary": ("cape_additive", "cape"),
    # The oracle arm: Steps II-III (and RoPE's order) on the data's true DAG instead of Step I's graph.
    "cape_oracle": ("cape", "true_dag"),
    "rope_oracle": ("rope", "true_dag"),
    "cape_paper_oracle": ("cape_paper", "true_dag"),
    # Controls that separate causal structure from gene identity (issue 33): the true DAG's norms with random
    # directions, the true DAG with its gene labels permuted, and RoPE on a random gene order.
    "cape_oracle_random_directions": ("cape", "true_dag", "random_directions"),
    "cape_oracle_permuted": ("cape", "true_dag", "permuted"),
    "rope_random_order": ("rope", "cape", "permuted"),
}


POSITION_SETS = ("cape", "correlation", "euclidean", "true_dag")  # plus "none": the data without Steps I-III


#: Where a simulation keeps its true weighted DAG (``A[i, j] != 0``: i → j).
TRUE_DAG_KEY = "true_dag"


NO_TRUE_DAG = f"no true graph: the dataset has no varp['{TRUE_DAG_KEY}'] (only simulations know theirs)"


METRICS = {
    "annotation": ("accuracy", "macro_f1"),
    "clustering": ("ARI", "NMI", "ASW"),
    "perturbation": ("mse_single", "mse_double", "mse_combo_seen0", "mse_combo_seen1", "mse_combo_seen2",
                     "mse_overall", "pearson_delta_single", "pearson_delta_double", "pearson_delta_combo_seen0",
                     "pearson_delta_combo_seen1", "pearson_delta_combo_seen2", "pearson_delta_overall",
                     "mse_downstream_overall", "pearson_delta_downstream_overall"),
}


LOWER_IS_BETTER = {m for m in METRICS["perturbation"] if m.startswith("mse")}


@dataclass(frozen=True)
class Variant:
    """One table row: a name, the registry encoding it runs and the position set it reads."""

    name: str
    encoding: str
    positions: str = "cape"  # "cape", "correlation", "euclidean", "true_dag" or "none"
    control: str | None = None  # a control drawn from the position set per seed (encodings_controls.CONTROLS)


#: The name that stands for each backbone's own default encoding (:data:`DEFAULT_ENCODING`) in a list of variants.
DEFAULT_ALIAS = "default"


def variants(names: Sequence[str] | None = None) -> list[Variant]:
    """The rows to run: registry encodings by name, ablations by their names (default: all of both), and
    ``"default"`` for each backbone's default encoding only (see :func:`for_backbone`)."""
    known = [*encodings.available(), *ABLATIONS]
    names = list(dict.fromkeys(names)) if names else known
    unknown = [n for n in names if n not in known and n != DEFAULT_ALIAS]
    if unknown:
        raise CapeInputError(f"unknown encoding(s) {', '.join(unknown)}; available: {', '.join(known)} "
                             f"and {DEFAULT_ALIAS} (each backbone's own)")
    return [Variant(n, *ABLATIONS[n]) if n in ABLATIONS
            else Variant(n, n, "none") if n == DEFAULT_ALIAS
            else Variant(n, n, _position_set(n)) for n in names]


def for_backbone(variant: Variant, backbone: str) -> Variant:
    """``variant`` as it runs on ``backbone``: the ``"default"`` alias becomes that backbone's default encoding."""
    if variant.name != DEFAULT_ALIAS:
        return variant
    name = DEFAULT_ENCODING[backbone]
    return Variant(name, name, _position_set(name))


def _position_set(encoding: str) -> str:
    """``"cape"`` when the encoding reads Steps I–III's keys, ``"none"`` when it needs no gene positions."""
    requires = encodings.get_class(encoding).requires
    return "none" if requires in (None, "values", "co_expression") else "cape"


@dataclass(frozen=True)
class BenchSettings:
    """Sizes and epochs of one benchmark run; :meth:`for_mode` gives the full and the ``--quick`` presets."""

    n_genes: int = 500
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    max_len: int | str = DEFAULT_RECIPE.max_len  # "auto": every expressed gene of a cell is a token
    batch_size: int = 32
    lr: float = 1e-3
    fine_tune_lr: float = DEFAULT_RECIPE.fit_lr
    # Pretraining (clustering, perturbation) follows the default recipe: masked values + the <cls> state's
    # reconstruction of each cell, every epoch run (a plateau early on is not the end).
    pretrain_epochs: int = DEFAULT_RECIPE.pretrain_epochs
    # Annotation follows `cape train`'s recipe: no masked-value pretraining (it lowered validation accuracy on
    # pbmc68k_reduced), up to ``fine_tune_epochs`` with early stopping on 20 % of the fine-tune cells.
    annotation_pretrain_epochs: int = 0
    # "validation": fine-tune on half of the 30 % fine-tune cells and score the other half (choosing defaults
    # without looking at the test cells); "test": score the 70 % test cells.
    annotation_score_on: str = "test"
    fine_tune_epochs: int = 100
    fine_tune_patience: int = 15
    patience: int | None = DEFAULT_RECIPE.pretrain_patience
    dropout: float = DEFAULT_RECIPE.dropout
    causal_epochs: int = 100
    causal_tau: float | str = "budget"  # Step I's default rule (tl.causal_graph); 0.2 is the paper's τ
    causal_rank: int = 40
    embed_dim: int | None = None  # None: d_model / (2·bands); one band: the paper's d = D/2
    bands: int = 1  # Step III bands (tl.rotary_encoding); cape_paper rows always use the low band alone
    band_top: float = DEFAULT_BAND_TOP
    embed_epochs: int = 1000
    corr_neighbors: int = 5
    predictor_epochs: int = 400

    def __post_init__(self) -> None:
        if self.annotation_score_on not in ("test", "validation"):
            raise CapeInputError(f"annotation_score_on must be 'test' or 'validation', got "
                                 f"{self.annotation_score_on!r}")
        if self.embed_dim is None:  # the paper's d = D/2 (Supp. F.4): one coordinate per rotation plane per band
            object.__setattr__(self, "embed_dim", self.d_model // (2 * self.bands))

    @classmethod
    def for_mode(cls, quick: bool, **overrides) -> BenchSettings:
        # Fine-tuning keeps `cape train`'s ≤ 100 epochs / patience 15 in quick mode too: with 40 / 10, models whose
        # gene identity is weak (integration="replace") were stopped before they took off.
        base = cls(n_genes=200, d_model=32, n_layers=2, n_heads=2, causal_epochs=100, embed_epochs=300,
                   predictor_epochs=150) if quick else cls()
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if ({"d_model", "bands"} & set(overrides)) and "embed_dim" not in overrides:
            overrides["embed_dim"] = overrides.get("d_model", base.d_model) // (2 * overrides.get("bands", base.bands))
        return replace(base, **overrides)


# ----------------------------------------------------------------------------------------------------------------
# data and positions
# ----------------------------------------------------------------------------------------------------------------
def prepare_expression(adata: ad.AnnData, n_genes: int) -> ad.AnnData:
    """Dense-safe, non-negative, log-scale copy restricted to the ``n_genes`` most dispersed genes (scanpy seurat),
    plus the perturbed genes of GEARS-format data (``obs["condition"]``), which the perturbation task needs.

    Small negative values (krumsiek11's simulation noise) are clipped to 0 with a log line: the backbones bin
    non-negative log expression.
    """

    out = adata.copy()
    x = out.X
    data = x.data if sp.issparse(x) else np.asarray(x)
    if data.size and np.nanmin(data) < 0:
        logger.info("clipping %d negative expression values to 0", int((data < 0).sum()))
        if sp.issparse(x):
            x = x.copy()
            x.data = np.clip(x.data, 0, None)
            out.X = x
        else:
            out.X = np.clip(np.asarray(x, dtype=np.float32), 0, None)
    if out.n_vars > n_genes:
        tmp = out.copy()
        tmp.uns.pop("log1p", None)
        sc.pp.highly_variable_genes(tmp, n_top_genes=n_genes, flavor="seurat")
        keep = tmp.var["highly_variable"].to_numpy()
        conditions = out.obs["condition"].astype(str).unique() if "condition" in out.obs else []
        if "ctrl" in conditions:  # GEARS format; as GEARS' processing: the HVGs and every perturbed gene
            targets = {g for c in conditions for g in condition_genes(c)}
            keep = keep | out.var_names.isin(list(targets))
        out = out[:, keep].copy()
    out.var["cape_used"] = True
    return out


def correlation_graph(x, k: int = 5) -> sp.csr_matrix:
    """Gene similarity graph for CAPE-w/o-CSL: each gene joined to its ``k`` most |Pearson|-correlated genes,
    weight |r| (the paper's "undirected similar matrix").

    Step II embeds a DAG, so each undirected edge is oriented by a causality-agnostic total order: from the gene
    with the larger weighted degree (similarity hub) to the smaller, ties by column index. The result is acyclic
    and carries no causal direction learnt from the data.
    """
    z, constant = zscore_columns(x)
    corr = np.abs(z.T @ z / max(z.shape[0], 1))
    np.fill_diagonal(corr, 0.0)
    corr[:, constant] = 0.0
    corr[constant, :] = 0.0
    n = corr.shape[0]
    k = min(k, n - 1)
    rows = np.repeat(np.arange(n), k)
    cols = np.argsort(-corr, axis=1)[:, :k].ravel()
    w = corr[rows, cols]
    keep = w > 0
    a = sp.csr_matrix((w[keep], (rows[keep], cols[keep])), shape=(n, n))
    a = a.maximum(a.T).tocoo()  # undirected similarity
    degree = np.asarray(a.sum(axis=1)).ravel()
    rank = np.empty(n, dtype=np.int64)
    rank[np.lexsort((np.arange(n), -degree))] = np.arange(n)  # 0 = largest weighted degree
    forward = rank[a.row] < rank[a.col]
    return sp.csr_matrix((a.data[forward], (a.row[forward], a.col[forward])), shape=(n, n))


def position_sets(adata: ad.AnnData, needed: Sequence[str], settings: BenchSettings, *, seed: int = 0,
                  device: str | None = None) -> tuple[dict[str, ad.AnnData], list[dict]]:
    """Steps I–III once per position set: ``cape`` (causal DAG → hyperbolic → rotary), ``euclidean`` (the same DAG
    embedded in Euclidean space by plain SGD), ``correlation`` (|corr| kNN graph → hyperbolic → rotary) and
    ``true_dag`` (the data's ``varp["true_dag"]`` in place of Step I, weights by magnitude; left out, with a log
    line, when the data has no true graph).

    Returns ``{set name: AnnData with the set's var/varm/varp keys}`` and timing records.
    """

    needed = [s for s in POSITION_SETS if s in set(needed)]
    out: dict[str, ad.AnnData] = {}
    timings: list[dict] = []
    embed = {"dim": settings.embed_dim, "epochs": settings.embed_epochs, "device": device or "auto", "seed": seed}
    if {"cape", "euclidean"} & set(needed):
        base = adata.copy()
        start = time.perf_counter()
        tl.causal_graph(base, rank=settings.causal_rank, tau=settings.causal_tau, epochs=settings.causal_epochs,
                        device=device or "auto", seed=seed, use_genes=None)
        step1 = time.perf_counter() - start
        n_edges = int(base.varp["cape_dag"].nnz)
        if n_edges == 0:
            logger.warning("Step I kept no edge above tau=%s: every gene sits at the origin, so CAPE positions "
                           "carry no information in this run (lower --causal-tau or train Step I longer)",
                           settings.causal_tau)
        timings += [{"position_set": "cape", "step": "I_causal_graph", "metric": "seconds", "value": step1},
                    {"position_set": "cape", "step": "I_causal_graph", "metric": "n_edges", "value": n_edges}]
        for name, geometry in (("cape", "hyperbolic"), ("euclidean", "euclidean")):
            if name not in needed:
                continue
            pos = base.copy()
            start = time.perf_counter()
            # optimizer "rsgd" is Riemannian SGD on the hyperboloid and plain SGD in Euclidean space (paper's ablation)
            tl.hyperbolic_embedding(pos, geometry=geometry, optimizer="rsgd", **embed)
            tl.rotary_encoding(pos, bands=settings.bands, band_top=settings.band_top)
            timings.append({"position_set": name, "step": "II_III_embedding", "metric": "seconds",
                            "value": time.perf_counter() - start})
            out[name] = pos
    if "correlation" in needed:
        pos = adata.copy()
        start = time.perf_counter()
        graph = correlation_graph(pos.X, k=settings.corr_neighbors)
        seconds_graph = time.perf_counter() - start
        tl.hyperbolic_embedding(pos, adjacency=graph, geometry="hyperbolic", optimizer="rsgd", **embed)
        tl.rotary_encoding(pos, bands=settings.bands, band_top=settings.band_top)
        # varp["cape_dag"] stays absent: encodings reading a DAG must not see the similarity graph as causal
        pos.uns["cape"]["correlation_graph"] = {"k": settings.corr_neighbors, "n_edges": int(graph.nnz)}
        timings += [{"position_set": "correlation", "step": "I_correlation_graph", "metric": "seconds",
                     "value": seconds_graph},
                    {"position_set": "correlation", "step": "I_correlation_graph", "metric": "n_edges",
                     "value": int(graph.nnz)},
                    {"position_set": "correlation", "step": "II_III_embedding", "metric": "seconds",
                     "value": time.perf_counter() - start - seconds_graph}]
        out["correlation"] = pos
    if "true_dag" in needed:
        if TRUE_DAG_KEY not in adata.varp:
            logger.warning("oracle rows not run: %s", NO_TRUE_DAG)
        else:
            pos = adata.copy()
            start = time.perf_counter()
            # Step II reads magnitudes; the sign (activation or repression) is not a position.
            pos.varp["cape_dag"] = abs(sp.csr_matrix(pos.varp[TRUE_DAG_KEY], dtype=np.float64))
            tl.hyperbolic_embedding(pos, geometry="hyperbolic", optimizer="rsgd", **embed)
            tl.rotary_encoding(pos, bands=settings.bands, band_top=settings.band_top)
            timings += [{"position_set": "true_dag", "step": "II_III_embedding", "metric": "seconds",
                         "value": time.perf_counter() - start},
                        {"position_set": "true_dag", "step": "I_true_dag", "metric": "n_edges",
                         "value": int(pos.varp["cape_dag"].nnz)}]
            out["true_dag"] = pos
    return out, timings


# ----------------------------------------------------------------------------------------------------------------
# one model
# ----------------------------------------------------------------------------------------------------------------
def build_model(data: ad.AnnData, backbone: str, variant: Variant, settings: BenchSettings, seed: int,
                device: str | None = None, integration: str = "complement"):
    """A :class:`~cape.models.CellTransformer` for ``variant`` on ``data`` (which carries the position keys)."""

    return CellTransformer(data, backbone, variant.encoding, d_model=settings.d_model, n_layers=settings.n_layers,
                           n_heads=settings.n_heads, max_len=settings.max_len, dropout=settings.dropout, seed=seed,
                           integration=integration, device=device or "auto")


def _pretrain(model, data: ad.AnnData, settings: BenchSettings, epochs: int | None = None) -> None:
    epochs = settings.pretrain_epochs if epochs is None else epochs
    if epochs > 0:
        model.pretrain(data, epochs=epochs, batch_size=settings.batch_size, lr=settings.lr,
                       validation_fraction=0.1, early_stopping_patience=settings.patience,
                       cell_weight=DEFAULT_RECIPE.cell_weight)


def annotation_run(model, data: ad.AnnData, labels: pd.Series, split, settings: BenchSettings) -> dict[str, float]:
    """Pretrain on every cell (no labels), fine-tune on the split's fine-tune cells, score its test cells."""
    _pretrain(model, data, settings, settings.annotation_pretrain_epochs)
    fine_tune = fine_tune_cells(data, roles(data, labels, split), labels, "_label")
    model.train(fine_tune, "_label", epochs=settings.fine_tune_epochs, batch_size=settings.batch_size,
                lr=settings.fine_tune_lr, validation_fraction=0.2, early_stopping_patience=settings.fine_tune_patience)
    predicted = model.predict(data[labels.index][split.test])
    return annotation_metrics(labels.to_numpy()[split.test], np.asarray(predicted))


def clustering_run(model, data: ad.AnnData, labels: pd.Series, settings: BenchSettings, seed: int
                   ) -> dict[str, float]:
    """Pretrain (no labels), embed cells, k-means with k = number of labels; ARI, NMI, ASW."""
    _pretrain(model, data, settings)  # no labels here: the pretrained <cls> state is the cell embedding
    cells = data[labels.index].copy()
    cells.obs["_label"] = labels.to_numpy()
    model.embed(cells, gene_key=None)
    result = cluster_embedding(cells, "_label", seed=seed)
    return {k: v for k, v in result.items() if k != "k"}


def perturbation_run(model, task: PerturbationTask, control: ad.AnnData, settings: BenchSettings, seed: int
                     ) -> dict[str, float]:
    """Pretrain on control cells, contextual gene embeddings → embedding predictor → top-20 DE MSE."""
    _pretrain(model, control, settings)
    emb = control.copy()
    model.embed(emb, key_added="_cells", gene_key="_genes")
    genes = pd.DataFrame(emb.varm["_genes"], index=emb.var_names).reindex(task.adata.var_names).fillna(0.0)
    predictor = EmbeddingPerturbationPredictor(genes.to_numpy(), epochs=settings.predictor_epochs, seed=seed)
    return task.score(predictor)


@dataclass
class BenchmarkResult:
    records: list[dict]
    settings: BenchSettings
    seconds: float
    paths: dict[str, Path]
    cpu_seconds: float = float("nan")  # CPU time with the --jobs workers': comparable across machine loads
