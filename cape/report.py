"""The end of a workflow run: metrics of the trained model against simple baselines, and a markdown report."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import anndata as ad
import numpy as np

from ._errors import CapeInputError

logger = logging.getLogger("cape")

#: ``obs`` column written by ``cape train --fine-tune-fraction``: "fine_tune" or "test" for labelled cells.
SPLIT_KEY = "cape_split"


def evaluate_run(adata: ad.AnnData, label_key: str | None, *, dataset: str = "data", seed: int = 0,
                 embedding_key: str = "X_cape") -> list[dict]:
    """Metrics of a trained run as records ``{task, dataset, method, seed, metric, value}``.

    * annotation (when ``obs[f"cape_{label_key}_prediction"]`` and ``obs["cape_split"]`` exist): accuracy and
      macro-F1 on the test cells, beside logistic regression on PCA trained on the same fine-tune cells;
    * clustering (when ``label_key`` is given): k-means (k = number of labels) on ``obsm[embedding_key]`` —
      ARI, NMI, ASW — beside PCA + k-means on the expression;
    * graph: edges of ``varp["cape_dag"]``, edges removed to make it acyclic, genes embedded.
    """
    from .bench.annotation import AnnotationSplit, annotation_metrics, checked_labels, logistic_regression_pca
    from .bench.clustering import cluster_embedding, run_clustering_baselines

    records: list[dict] = []

    def add(task: str, method: str, metrics: dict) -> None:
        records.extend({"task": task, "dataset": dataset, "method": method, "seed": seed, "metric": k,
                        "value": float(v)} for k, v in metrics.items() if isinstance(v, int | float))

    info = adata.uns.get("cape", {})
    if "cape_dag" in adata.varp:
        graph = {"edges": int((adata.varp["cape_dag"] != 0).sum())}
        removed = info.get("causal_graph", {}).get("removed_cycle_edges")
        if removed is not None:
            graph["edges_removed_for_acyclicity"] = int(removed)
        if "cape_embedded" in adata.var:
            graph["genes_embedded"] = int(adata.var["cape_embedded"].sum())
        add("graph", "cape", graph)
    if label_key is None:
        return records
    labels = checked_labels(adata, label_key)
    pred_key = f"cape_{label_key}_prediction"
    if pred_key in adata.obs and SPLIT_KEY in adata.obs:
        split = adata.obs.loc[labels.index, SPLIT_KEY].astype(str).to_numpy()
        test = np.flatnonzero(split == "test")
        fine_tune = np.flatnonzero(split == "fine_tune")
        if test.size == 0 or fine_tune.size == 0:
            raise CapeInputError(f"obs[{SPLIT_KEY!r}] needs both 'fine_tune' and 'test' cells")
        predicted = adata.obs.loc[labels.index, pred_key].astype(str).to_numpy()
        add("annotation", "cape", annotation_metrics(labels.to_numpy()[test], predicted[test]))
        baseline = logistic_regression_pca(
            adata, label_key, seed=seed,
            split=AnnotationSplit(fine_tune, test, seed, fine_tune.size / (fine_tune.size + test.size)))
        add("annotation", "logreg_pca", {k: baseline[k] for k in ("accuracy", "macro_f1")})
    elif pred_key in adata.obs:
        logger.warning("no obs[%r]: annotation metrics skipped (the model was fine-tuned on every cell)", SPLIT_KEY)
    if embedding_key in adata.obsm:
        add("clustering", "cape", cluster_embedding(adata, label_key, obsm_key=embedding_key, seed=seed))
    for rec in run_clustering_baselines(adata, label_key, dataset=dataset, seeds=(seed,), methods=["pca_kmeans"]):
        records.append({k: rec[k] for k in ("task", "dataset", "method", "seed", "metric", "value")})
    return records


def attention_records(adata: ad.AnnData, model_dir: str | os.PathLike, *, dataset: str = "data", seed: int = 0,
                      n_cells: int = 256) -> list[dict]:
    """Behind-RoPE non-relativity of every attention layer of the trained model in ``model_dir``.

    Measured against the model's own gene positions and, when the AnnData has them, against the Poincaré
    positions of Step II (see :func:`cape.bench.layer_relativity.layer_non_relativity`). A key that does not apply
    (e.g. an encoding without positions) is skipped with a log line.
    """
    from .bench.layer_relativity import layer_non_relativity
    from .models import CellTransformer

    model = CellTransformer.load(model_dir, adata, device="cpu")
    encoding = model.backbone.encoding_name
    records = []
    for key in ("model", "cape_poincare"):
        try:
            rows = layer_non_relativity(model, adata, key=key, n_cells=n_cells, seed=seed)
        except CapeInputError as err:
            logger.info("non-relativity against %s skipped: %s", key, err)
            continue
        label = "own positions" if key == "model" else "Poincaré distance"
        records.extend({"task": "attention", "dataset": dataset, "method": f"{encoding} vs {label}", "seed": seed,
                        "metric": f"non-relativity layer {r['layer']}", "value": float(r["nri"])} for r in rows)
    return records


def _metrics_table(records: list[dict]) -> str:
    from .bench.report import mean_sd_table

    tables = []
    for task in dict.fromkeys(r["task"] for r in records):
        sub = [r for r in records if r["task"] == task]
        note = ("Behind-RoPE non-relativity index of the mean attention logits per layer: 0 = a function of the "
                "relative position only, ~1 = unrelated to it.\n\n" if task == "attention" else "")
        tables.append(f"### {task}\n\n{note}" + mean_sd_table(sub, rows=["method"], columns=["metric"]))
    return "\n\n".join(tables)


def write_report(adata: ad.AnnData, records: list[dict], output: str | os.PathLike, *,
                 label_key: str | None = None, title: str = "cape run") -> Path:
    """Markdown report with the learnt DAG, the Poincaré disk, the cell embedding and the metrics.

    Figures are written next to ``output`` in ``<stem>_figures/``; the report links them relatively.
    """
    import matplotlib.pyplot as plt

    from . import pl
    from .bench.report import save_figure, write_text

    out = Path(output)
    fig_dir = out.parent / f"{out.stem}_figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    sections = [f"# {title}\n", _summary(adata, label_key)]
    figures = []
    if "cape_dag" in adata.varp and adata.varp["cape_dag"].nnz:
        figures.append(pl.dag(adata, return_fig=True))
        save_figure(figures[-1], fig_dir / "dag.png")
        sections.append(f"## Causal gene graph (Step I)\n\n![DAG]({fig_dir.name}/dag.png)")
    if "cape_poincare" in adata.varm:
        figures.append(pl.poincare(adata, components=(0, 1), return_fig=True,
                                   title="genes in the Poincaré disk (first two coordinates), coloured by generality"))
        save_figure(figures[-1], fig_dir / "poincare.png")
        sections.append(f"## Hyperbolic embedding (Step II)\n\n![Poincaré disk]({fig_dir.name}/poincare.png)")
    if "X_cape" in adata.obsm:
        figures.append(_embedding_figure(adata, label_key))
        save_figure(figures[-1], fig_dir / "cells.png")
        sections.append(f"## Cell embedding\n\n![cells]({fig_dir.name}/cells.png)")
    if records:
        sections.append("## Metrics\n\n" + _metrics_table(records))
    for fig in figures:  # only ours: a notebook's other figures stay open
        plt.close(fig)
    write_text("\n\n".join(sections) + "\n", out)
    return out


def _summary(adata: ad.AnnData, label_key: str | None) -> str:
    info = adata.uns.get("cape", {})
    lines = [f"- data: {adata.n_obs} cells × {adata.n_vars} genes"
             + (f" (dataset {info['dataset']['name']})" if "dataset" in info else "")]
    if "cape_used" in adata.var:
        lines.append(f"- genes in the causal graph: {int(adata.var['cape_used'].sum())}")
    for step in ("preprocess", "causal_graph", "hyperbolic_embedding", "rotary_encoding", "model"):
        if step in info:
            seconds = next((info[step][k] for k in ("wall_time", "seconds") if k in info[step]), None)
            lines.append(f"- {step}: done" + (f" in {float(seconds):.1f} s" if seconds is not None else ""))
    if label_key:
        lines.append(f"- labels: obs[{label_key!r}] ({adata.obs[label_key].nunique()} classes)")
    return "## Run\n\n" + "\n".join(lines)


def _embedding_figure(adata: ad.AnnData, label_key: str | None):
    import matplotlib.pyplot as plt
    from sklearn.decomposition import PCA

    emb = np.asarray(adata.obsm["X_cape"], dtype=float)
    xy = PCA(n_components=2, random_state=0).fit_transform(emb) if emb.shape[1] > 2 else emb
    fig, ax = plt.subplots(figsize=(7, 5.5))
    if label_key and label_key in adata.obs:
        labels = adata.obs[label_key].astype(str)
        for name in sorted(labels.unique()):
            m = (labels == name).to_numpy()
            ax.scatter(xy[m, 0], xy[m, 1], s=8, label=name)
        ax.legend(fontsize=7, markerscale=2, loc="best", frameon=False)
    else:
        ax.scatter(xy[:, 0], xy[:, 1], s=8)
    ax.set_xlabel("PC1 of X_cape")
    ax.set_ylabel("PC2 of X_cape")
    ax.set_title("cells: PCA of the transformer's <cls> embedding")
    return fig


def write_metrics(records: list[dict], path: str | os.PathLike) -> Path:
    from .bench.report import write_json

    return write_json(records, path)


def read_metrics(path: str | os.PathLike) -> list[dict]:
    return json.loads(Path(path).read_text())


def resolve_label_key(adata: ad.AnnData, label_key: str | None) -> str | None:
    """``"auto"``: the dataset manifest's label key (``uns["cape"]["dataset"]["keys"]["labels"]``) when the data
    came from a named dataset, else none; ``None``: no labels; anything else must be an ``obs`` column."""
    if label_key == "auto":
        label_key = adata.uns.get("cape", {}).get("dataset", {}).get("keys", {}).get("labels")
        if label_key is None:
            logger.info("no label key given and none known for this data: annotation and clustering are skipped")
            return None
    if label_key is not None and label_key not in adata.obs:
        raise CapeInputError(f"label key obs[{label_key!r}] not found; obs columns: "
                             f"{', '.join(map(str, adata.obs.columns)) or '(none)'}")
    return label_key
