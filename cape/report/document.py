"""The report of a run: verdict first, then the run, the learnt DAG, the Poincaré disk, the cells, the metric
tables (markdown, plus HTML pages for Snakemake's report); ``metrics.json`` in and out."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anndata as ad
import matplotlib.pyplot as plt
import numpy as np
from sklearn.decomposition import PCA

from .. import pl
from .._io import save_figure, write_json, write_text
from .._tables import html_page, html_table, markdown_table, mean_sd_table, parse_markdown_table
from ..causal.pair_ranking import PAIR_RANKING_WORDS
from ..causal.postprocess import BUDGET_TEST_NAMES
from .edges import edge_table, solid_sentence
from .findings import verdict, verdict_html, verdict_markdown
from .resources import resources_from_records
from .statistics import N_BOOTSTRAP

#: Tasks the verdict shows itself, left out of the metrics tables.
_VERDICT_TASKS = ("resources",)


def _metric_tables(records: list[dict]) -> list[tuple[str, str, list[str], list[list[str]]]]:
    """(task, note, header, rows) per task, values as ``mean ± sd`` over seeds."""

    notes = {"attention": "Behind-RoPE non-relativity index, one column per attention layer. Each row measures the "
                          "transformer's mean attention logits between gene pairs (averaged over cells and heads) "
                          "against a distance between the two genes: `own positions`, the positions its encoding "
                          "reads; `Poincaré distance`, Step II's causal geometry. The index is the spread the "
                          "distance leaves unexplained (the RMS of the logits minus the mean of their distance bin, "
                          "over the logits' standard deviation): 0 = how strongly two genes attend depends only on how "
                          "far apart they sit, ~1 = it is unrelated to that distance (gene identity and expression "
                          "decide). Lower means attention that follows the positions; it is a description, not a "
                          "score to maximise. Genes without a position are left out.",
             "comparison": f"The transformer minus its same-run baseline, with the {N_BOOTSTRAP:,}-resample "
                           "bootstrap interval (95 %) over the cells scored.",
             "graph": "Step I's graph: `edges` kept; `edges_removed_for_acyclicity`, edges above the threshold "
                      "dropped, weakest first, where they would close a cycle (Step II needs a DAG; under the edge "
                      "budget, the pair ranking's weakest pairs instead); `edges_turned_for_acyclicity`, budget "
                      "edges kept against the fit's direction, which would have closed a cycle; "
                      "`genes_with_an_edge`, the genes the graph places; `genes_embedded`, the genes that took "
                      "part in Step II (with `isolated: negatives` also those without an edge, which it spreads "
                      "apart); `fraction_of_genes_at_origin`, the share of the used genes within 1e-3 of the disk's "
                      "centre."}
    tables = []
    for task in dict.fromkeys(r["task"] for r in records):
        if task in _VERDICT_TASKS:
            continue
        sub = [r for r in records if r["task"] == task]
        header, rows = parse_markdown_table(mean_sd_table(sub, rows=["method"], columns=["metric"]))
        tables.append((task, notes.get(task, ""), header, rows))
    return tables


def _metrics_table(records: list[dict]) -> str:
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

    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    drawers = {
        "dag.png": ("cape_dag" in adata.varp and adata.varp["cape_dag"].nnz, lambda: pl.dag(adata, return_fig=True)),
        "poincare.png": ("cape_poincare" in adata.varm and _any_positioned(adata), lambda: pl.poincare(
            adata, return_fig=True)),
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
    per-stage rows of :func:`cape.report.resources.stage_resources` (default: those in ``records``, task "resources").
    """

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
    edges = edge_table(adata)
    if edges:
        sections.append(edges)
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
            line = f"- {step}: done" + (f" in {float(seconds):.1f} s" if seconds is not None else "")
            if step == "causal_graph" and "n_edges" in info[step]:  # which Step I model, and what it kept
                model = info[step].get("params", {}).get("model", "variational")
                line += f"; model {model}, {int(info[step]['n_edges'])} edges"
                if "tau_used" in info[step]:
                    rule, budget = info[step].get("tau_rule"), info[step].get("edge_budget", {})
                    # a pair ranking cuts no single τ: its tau_used is the lightest kept weight
                    at = "with weights down to" if budget.get("pair_ranking") in PAIR_RANKING_WORDS else "at τ"
                    line += f" {at} {float(info[step]['tau_used']):.3g}"
                    if rule == "budget":
                        subset = budget.get("cells_tested", "all") != "all"
                        test = f"{BUDGET_TEST_NAMES.get(budget['test'], budget['test'])}, " if "test" in budget else ""
                        # filled: the strict count first, then the pairs the fill's looser rate added
                        counted = (f"{int(budget['n_pairs_strict'])} gene pairs with a significant partial "
                                   f"correlation, {test}FDR {float(budget['fdr']):g}, filled to "
                                   f"{int(budget['n_pairs'])} from those at FDR {float(budget['fill_fdr']):g} "
                                   "given the cell states too (up to one pair per gene)"
                                   if budget.get("filled") else
                                   f"{int(budget['n_pairs'])} gene pairs with a significant partial correlation, "
                                   f"{test}FDR {float(budget['fdr']):g}")
                        line += (f" (threshold rule budget: {counted}"
                                 + (f", tested on a random {int(budget['n_cells_tested'])} cells" if subset else "")
                                 + (f", beyond the {int(budget['n_pairs_permuted'])} it calls with every gene permuted"
                                    if budget.get("n_pairs_permuted") else "")
                                 + (f", {PAIR_RANKING_WORDS[budget['pair_ranking']]}"
                                    if budget.get("pair_ranking") in PAIR_RANKING_WORDS else "")
                                 + ")")
                    elif rule:
                        line += f" (threshold rule {rule})"
                solid = solid_sentence(info[step].get("edge_confidence"), int(info[step]["n_edges"]))
                line += f"; {solid}" if solid else ""
                if "interventions" in info[step]:
                    given = info[step]["interventions"]
                    line += (f"; interventions obs[{given['key']!r}]: {int(given['n_intervened_cells'])} perturbed "
                             "cells")
                    if not info[step].get("params", {}).get("leave_out_targets", True):
                        line += " (used to orient only)"
                if "orientation" in info[step]:
                    turned = info[step]["orientation"]
                    line += (f"; {int(turned['n_edges_turned'])} edge(s) turned by the perturbed genes' shifts "
                             f"({int(turned['n_shifted_pairs'])} of {int(turned['n_tested_pairs'])} tested pairs "
                             f"shifted, FDR {float(turned['fdr']):g})")
                if "likelihood_orientation" in info[step]:
                    by_likelihood = info[step]["likelihood_orientation"]
                    line += (f"; {int(by_likelihood['n_edges_turned'])} edge(s) turned by the likelihood "
                             f"(a likelihood-ratio test at {float(by_likelihood['level']):g} per turn)")
            at_origin = info[step].get("fraction_at_origin") if step == "hyperbolic_embedding" else None
            if at_origin is not None:  # such genes get no rotation: a rotary encoding cannot tell them apart
                line += f"; {float(at_origin):.1%} of the genes within 1e-3 of the origin"
            lines.append(line)
    if label_key:
        lines.append(f"- labels: obs[{label_key!r}] ({adata.obs[label_key].nunique()} classes)")
    return "## Run\n\n" + "\n".join(lines)


def _embedding_figure(adata: ad.AnnData, label_key: str | None):
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
    return write_json(records, path)


def read_metrics(path: str | os.PathLike) -> list[dict]:
    return json.loads(Path(path).read_text())
