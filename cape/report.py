"""The end of a workflow run: metrics of the trained model against simple baselines, and a markdown report."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import anndata as ad
import numpy as np

from ._errors import CapeInputError
from .models import CellTransformer
from .tasks.annotation import AnnotationSplit, annotation_metrics, logistic_regression_pca
from .tasks.attention import layer_non_relativity
from .tasks.clustering import BASELINES, _with_nan, clustering_metrics, kmeans_clusters, knn_impute
from .tasks.labels import SPLIT_KEY, checked_labels, resolve_label_key  # noqa: F401  (resolve_label_key: API)
from .verdict import accuracy, adjusted_rand, bootstrap_difference, comparison_records

logger = logging.getLogger("cape")



def evaluate_run(adata: ad.AnnData, label_key: str | None, *, dataset: str = "data", seed: int = 0,
                 embedding_key: str = "X_cape") -> list[dict]:
    """Metrics of a trained run as records ``{task, dataset, method, seed, metric, value}``.

    * annotation (when ``obs[f"cape_{label_key}_prediction"]`` and ``obs["cape_split"]`` exist): accuracy and
      macro-F1 on the test cells, beside logistic regression on PCA trained on the same fine-tune cells;
    * clustering (when ``label_key`` is given): k-means (k = number of labels) on ``obsm[embedding_key]`` —
      ARI, NMI, ASW — beside PCA + k-means on the expression;
    * graph: edges of ``varp["cape_dag"]``, edges removed to make it acyclic, genes embedded;
    * comparison: the transformer minus its baseline (accuracy; ARI) with a seeded bootstrap interval over the
      cells (:func:`cape.verdict.bootstrap_difference`), which the report's verdict reads.
    """
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
        truth = labels.to_numpy()[test]
        add("annotation", "cape", annotation_metrics(truth, predicted[test]))
        baseline = logistic_regression_pca(
            adata, label_key, seed=seed,
            split=AnnotationSplit(fine_tune, test, seed, fine_tune.size / (fine_tune.size + test.size)))
        add("annotation", "logreg_pca", {k: baseline[k] for k in ("accuracy", "macro_f1")})
        diff = bootstrap_difference(truth, predicted[test], baseline["test_predictions"], accuracy, seed=seed)
        records += comparison_records("annotation", "accuracy", "cape", "logreg_pca", diff, n_cells=test.size,
                                      dataset=dataset, seed=seed, n_fine_tune=fine_tune.size)
    elif pred_key in adata.obs:
        logger.warning("no obs[%r]: annotation metrics skipped (the model was fine-tuned on every cell)", SPLIT_KEY)
    # k-means with k = number of classes on the transformer's embedding and on PCA of the expression (the
    # "pca_kmeans" baseline of cape.tasks.clustering), kept here to compare the two clusterings cell by cell.
    y = labels.to_numpy()
    k = labels.nunique()
    sub = adata[labels.index] if len(labels) < adata.n_obs else adata
    clusters = {}
    # keep_sparse: a 10x-shaped X stays sparse (pca_embedding densifies only small matrices)
    expression = knn_impute(_with_nan(sub, keep_sparse=True))
    for method, emb in (("cape", _cell_embedding(sub, embedding_key)),
                        ("pca_kmeans", BASELINES["pca_kmeans"][0](expression, None, seed, 50))):
        if emb is None:
            continue
        clusters[method] = kmeans_clusters(emb, k, seed=seed)
        add("clustering", method, clustering_metrics(emb, y, clusters[method]) | ({"k": k} if method == "cape" else {}))
    if len(clusters) == 2:
        diff = bootstrap_difference(y, clusters["cape"], clusters["pca_kmeans"], adjusted_rand, seed=seed)
        records += comparison_records("clustering", "ARI", "cape", "pca_kmeans", diff, n_cells=len(y),
                                      dataset=dataset, seed=seed)
    return records


def _cell_embedding(adata: ad.AnnData, key: str) -> np.ndarray | None:
    if key not in adata.obsm:
        return None
    emb = np.asarray(adata.obsm[key], dtype=np.float64)
    if emb.ndim != 2 or not np.isfinite(emb).all():
        raise CapeInputError(f"obsm[{key!r}] must be a finite 2-D array")
    return emb


def attention_records(adata: ad.AnnData, model_dir: str | os.PathLike, *, dataset: str = "data", seed: int = 0,
                      n_cells: int = 256) -> list[dict]:
    """Behind-RoPE non-relativity of every attention layer of the trained model in ``model_dir``.

    Measured against the model's own gene positions and, when the AnnData has them, against the Poincaré
    positions of Step II (see :func:`cape.tasks.attention.layer_non_relativity`). A key that does not apply
    (e.g. an encoding without positions) is skipped with a log line.
    """
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


#: Tasks the verdict shows itself, left out of the metrics tables.
_VERDICT_TASKS = ("resources",)


def _metric_tables(records: list[dict]) -> list[tuple[str, str, list[str], list[list[str]]]]:
    """(task, note, header, rows) per task, values as ``mean ± sd`` over seeds."""
    from .bench.report import mean_sd_table
    from .verdict import N_BOOTSTRAP, parse_markdown_table

    notes = {"attention": "Behind-RoPE non-relativity index of the mean attention logits per layer: 0 = a function "
                          "of the relative position only, ~1 = unrelated to it.",
             "comparison": f"The transformer minus its same-run baseline, with the {N_BOOTSTRAP:,}-resample "
                           "bootstrap interval (95 %) over the cells scored."}
    tables = []
    for task in dict.fromkeys(r["task"] for r in records):
        if task in _VERDICT_TASKS:
            continue
        sub = [r for r in records if r["task"] == task]
        header, rows = parse_markdown_table(mean_sd_table(sub, rows=["method"], columns=["metric"]))
        tables.append((task, notes.get(task, ""), header, rows))
    return tables


def _metrics_table(records: list[dict]) -> str:
    from .verdict import markdown_table

    return "\n\n".join(f"### {task}\n\n" + (f"{note}\n\n" if note else "") + markdown_table(header, rows)
                        for task, note, header, rows in _metric_tables(records))


def figures_dir(output: str | os.PathLike) -> Path:
    """Folder of the report's figures and HTML tables: ``<stem>_figures/`` next to the report."""
    out = Path(output)
    return out.parent / f"{out.stem}_figures"


#: Figures of a report, in order: file name → (section heading, alt text).
FIGURES = {"dag.png": ("Causal gene graph (Step I)", "DAG"),
           "poincare.png": ("Hyperbolic embedding (Step II)", "Poincaré disk"),
           "cells.png": ("Cell embedding", "cells")}


def write_figures(adata: ad.AnnData, fig_dir: str | os.PathLike, *, label_key: str | None = None) -> list[str]:
    """Draw the DAG (when it has edges), the Poincaré disk and the cell embedding into ``fig_dir``; their names."""
    import matplotlib.pyplot as plt

    from . import pl
    from .bench.report import save_figure

    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    drawers = {
        "dag.png": ("cape_dag" in adata.varp and adata.varp["cape_dag"].nnz, lambda: pl.dag(adata, return_fig=True)),
        "poincare.png": ("cape_poincare" in adata.varm and _any_positioned(adata), lambda: pl.poincare(
            adata, components=(0, 1), return_fig=True,
            title="genes in the Poincaré disk (first two coordinates), coloured by generality")),
        "cells.png": ("X_cape" in adata.obsm, lambda: _embedding_figure(adata, label_key)),
    }
    written = []
    for name, (applies, draw) in drawers.items():
        if not applies:
            continue
        fig = draw()
        try:
            save_figure(fig, fig_dir / name)
        finally:
            plt.close(fig)  # only ours: a notebook's other figures stay open
        written.append(name)
    return written


def _any_positioned(adata: ad.AnnData) -> bool:
    return "cape_embedded" not in adata.var or bool(adata.var["cape_embedded"].any())


def write_report(adata: ad.AnnData, records: list[dict], output: str | os.PathLike, *,
                 label_key: str | None = None, title: str = "cape run", figures: list[str] | None = None,
                 resources: list[dict] | None = None) -> Path:
    """Markdown report: the verdict first, then the run, the learnt DAG, the Poincaré disk, the cells, the metrics.

    Figures are in ``<stem>_figures/`` next to ``output`` (drawn here unless ``figures`` names those already
    drawn by :func:`write_figures`); the report links them relatively. The same folder gets ``verdict.html`` and
    ``metrics.html``, the verdict and the metric tables as HTML pages for Snakemake's report. ``resources`` are the
    per-stage rows of :func:`cape.verdict.stage_resources` (default: those in ``records``, task "resources").
    """
    from .bench.report import write_text
    from .verdict import html_page, html_table, resources_from_records, verdict, verdict_html, verdict_markdown

    out = Path(output)
    fig_dir = figures_dir(out)
    if figures is None:
        figures = write_figures(adata, fig_dir, label_key=label_key)
    if resources is None:
        resources = resources_from_records(records) or None
    findings = verdict(adata, records, resources)
    sections = [f"# {title}\n", verdict_markdown(findings, resources), _summary(adata, label_key)]
    # A step that ran but left nothing to draw says so, instead of an empty figure.
    not_drawn = {"dag.png": ("cape_dag" in adata.varp, "The causal graph has no edges: nothing to draw."),
                 "poincare.png": ("cape_poincare" in adata.varm,
                                  "No gene got a position: every gene sits at the centre of the disk.")}
    for name, (heading, alt) in FIGURES.items():
        if name in figures:
            sections.append(f"## {heading}\n\n![{alt}]({fig_dir.name}/{name})")
        elif name in not_drawn and not_drawn[name][0]:
            sections.append(f"## {heading}\n\n{not_drawn[name][1]}")
    tables = _metric_tables(records)
    if tables:
        sections.append("## Metrics\n\n" + _metrics_table(records))
    write_text(verdict_html(findings, resources, title=f"{title}: verdict"), fig_dir / "verdict.html")
    body = "".join(f"<h3>{task}</h3>" + (f"<p>{note}</p>" if note else "") + html_table(header, rows)
                   for task, note, header, rows in tables) or "<p>No metrics (no labels and no graph).</p>"
    write_text(html_page(f"{title}: metrics", f"<h2>{title}: metrics</h2>{body}"), fig_dir / "metrics.html")
    write_text("\n\n".join(sections) + "\n", out)
    return out


def _summary(adata: ad.AnnData, label_key: str | None) -> str:
    info = adata.uns.get("cape", {})
    lines = [f"- data: {adata.n_obs} cells × {adata.n_vars} genes"
             + (f" (dataset {info['dataset']['name']})" if "dataset" in info else "")]
    if "cape_used" in adata.var:
        lines.append(f"- genes used by Steps I–III: {int(adata.var['cape_used'].sum())}")
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
