from __future__ import annotations

import json

from cape.report import evaluate_run, write_report


def test_report_has_figures_and_metrics(trained_adata, tmp_path):
    records = evaluate_run(trained_adata, "cell_type", dataset="toy")
    out = write_report(trained_adata, records, tmp_path / "report.md", label_key="cell_type")
    text = out.read_text()
    for fig in ("dag.png", "poincare.png", "cells.png"):
        assert (tmp_path / "report_figures" / fig).stat().st_size > 1000
        assert f"report_figures/{fig}" in text
    assert "### annotation" in text and "logreg_pca" in text
    json.dumps(records)


def test_report_states_the_share_of_genes_at_the_origin(trained_adata, tmp_path):
    adata = trained_adata.copy()
    adata.uns["cape"]["hyperbolic_embedding"] = {"seconds": 2.0, "fraction_at_origin": 0.25}
    records = evaluate_run(adata, "cell_type", dataset="toy")
    assert [r["value"] for r in records if r["metric"] == "fraction_of_genes_at_origin"] == [0.25]
    text = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert "hyperbolic_embedding: done in 2.0 s; 25.0% of the genes within 1e-3 of the origin" in text


def test_report_names_the_step_one_model_and_its_edges(trained_adata, tmp_path):
    adata = trained_adata.copy()
    adata.uns["cape"]["causal_graph"] = {**adata.uns["cape"]["causal_graph"], "wall_time": 3.0, "n_edges": 17,
                                         "tau_used": 0.2}
    records = evaluate_run(adata, "cell_type", dataset="toy")
    text = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    model = adata.uns["cape"]["causal_graph"].get("params", {}).get("model", "variational")
    assert f"causal_graph: done in 3.0 s; model {model}, 17 edges at τ 0.2" in text
    adata.uns["cape"]["causal_graph"]["params"] = {**adata.uns["cape"]["causal_graph"].get("params", {}),
                                                   "model": "parents_mlp"}
    text = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert "model parents_mlp, 17 edges" in text
    adata.uns["cape"]["causal_graph"] |= {"tau_rule": "budget", "edge_budget": {"n_pairs": 20, "fdr": 0.05},
                                          "interventions": {"key": "condition", "n_intervened_cells": 40}}
    text = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert ("17 edges at τ 0.2 (threshold rule budget: 20 gene pairs with a significant partial correlation, "
            "FDR 0.05); interventions obs['condition']: 40 perturbed cells") in text
    adata.uns["cape"]["causal_graph"]["edge_budget"] |= {"n_cells_tested": 2000,
                                                         "cells_tested": "random subset (seed 0)"}
    text = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert "partial correlation, FDR 0.05, tested on a random 2000 cells); interventions" in text
    adata.uns["cape"]["causal_graph"]["edge_budget"]["test"] = "both"  # the test, in words
    text = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert "partial correlation, Fisher's z and the robust test, FDR 0.05, tested on a random 2000 cells)" in text
    adata.uns["cape"]["causal_graph"]["edge_budget"]["n_pairs_permuted"] = 6  # the test's calls on a null copy
    text = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert "2000 cells, beyond the 6 it calls with every gene permuted)" in text
    adata.uns["cape"]["causal_graph"]["edge_budget"]["n_pairs_permuted"] = 0
    adata.uns["cape"]["causal_graph"]["edge_budget"]["pair_ranking"] = "consensus"  # which pairs, in words
    text = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert ("17 edges with weights down to 0.2 (threshold rule budget: 20 gene pairs" in text
            and "tested on a random 2000 cells, the pairs ranked by the fit and the partial correlations together)"
            in text)
    adata.uns["cape"]["causal_graph"]["edge_budget"]["pair_ranking"] = "shrunk_partial_correlation"
    text = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert "17 edges with weights down to 0.2" in text
    filled = {"filled": True, "n_pairs_strict": 7, "fill_fdr": 0.2}  # the strict count, then the fill's
    adata.uns["cape"]["causal_graph"]["edge_budget"] |= filled
    text = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert ("(threshold rule budget: 7 gene pairs with a significant partial correlation, Fisher's z and the robust "
            "test, FDR 0.05, filled to 20 from those at FDR 0.2 given the cell states too (up to one pair per gene), "
            "tested on a random") in text
    adata.uns["cape"]["causal_graph"]["edge_budget"]["filled"] = False
    text = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert "budget: 20 gene pairs with a significant" in text and "filled to" not in text
    assert "the pairs ranked by their shrunk partial correlation)" in text
    adata.uns["cape"]["causal_graph"]["params"]["leave_out_targets"] = False
    adata.uns["cape"]["causal_graph"]["orientation"] = {"n_edges_turned": 3, "n_shifted_pairs": 12,
                                                        "n_tested_pairs": 60, "fdr": 0.05}
    text = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert ("40 perturbed cells (used to orient only); 3 edge(s) turned by the perturbed genes' shifts (12 of 60 "
            "tested pairs shifted, FDR 0.05)") in text


def test_non_relativity_table_says_how_to_read_it(trained_adata, tmp_path):
    records = [{"task": "attention", "dataset": "d", "method": f"cape vs {key}", "seed": 0,
                "metric": "non-relativity layer 0", "value": value}
               for key, value in (("own positions", 0.4), ("Poincaré distance", 0.7))]
    text = write_report(trained_adata, records, tmp_path / "report.md").read_text()
    table = text.split("### attention", 1)[1]
    assert "0 = how strongly two genes attend depends only on how far apart they sit" in table
    assert "`Poincaré distance`, Step II's causal geometry" in table and "one column per attention layer" in table


def test_report_lists_the_strongest_edges_with_their_confidence(trained_adata, tmp_path):
    import numpy as np
    import scipy.sparse as sp

    adata = trained_adata.copy()
    records = evaluate_run(adata, "cell_type", dataset="toy")
    dag = np.zeros((adata.n_vars, adata.n_vars))
    dag[0, 1], dag[2, 3], dag[1, 4] = 0.9, -0.5, 0.2
    adata.varp["cape_dag"] = sp.csr_matrix(dag)
    adata.varp["cape_dag_confidence"] = sp.csr_matrix(np.where(dag != 0, 1.0, 0.0) - np.where(dag == 0.2, 0.6, 0))
    adata.uns["cape"]["causal_graph"] = {**adata.uns["cape"]["causal_graph"], "n_edges": 3,
                                         "edge_confidence": {"n_solid": 2, "solid_confidence": 0.95, "n_states": 4}}
    text = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    genes = adata.var_names
    assert "3 edges" in text and ("2 of 3 edges solid (confidence ≥ 0.95: the dependence holds given the child's "
                                  "other parents and 4 cell state(s); Step I's edge budget did not run, so no test "
                                  "of each pair given every other gene backs it)") in text
    adata.uns["cape"]["causal_graph"]["edge_confidence"]["n_hypotheses"] = 45
    family = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert "backs it, and the q-values count all 45 gene pairs the graph was chosen from)" in family
    del adata.uns["cape"]["causal_graph"]["edge_confidence"]["n_hypotheses"]
    # edges the confidence could not test (a gene seen in a handful of cells) are counted as guesses
    adata.uns["cape"]["causal_graph"]["edge_confidence"] |= {"n_untested": 1, "min_detected_cells": 10}
    untested = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert "; 1 not tested, guesses (a gene varying in fewer than 10 cells, or no degrees of freedom left)" in untested
    del adata.uns["cape"]["causal_graph"]["edge_confidence"]["n_untested"]
    # where the edge budget tested every pair, the sentence says that a solid edge's pair is among those it counted
    adata.uns["cape"]["causal_graph"]["edge_confidence"]["n_pairs_supported"] = 7
    supported = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert ("4 cell state(s), and the pair is among the 7 the edge budget counted given every other gene)"
            in supported)
    assert ("whose gene pair Step I's edge budget did not count given every other gene, or that joins a gene varying "
            "in fewer than 10 cells (not tested)") in supported
    adata.uns["cape"]["causal_graph"]["edge_confidence"] |= {"n_pairs_supported": 0, "n_solid": 0}
    none = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert ("0 of 3 edges solid: the edge budget counted no gene pair given every other gene, so every edge is a "
            "guess") in none
    table = text.split("## Strongest edges")[1]
    assert f"| {genes[0]} | {genes[1]} | +0.9 | 1.000 | solid |" in table
    assert f"| {genes[1]} | {genes[4]} | +0.2 | 0.400 | guess |" in table
    assert table.index(genes[3]) < table.index(genes[4])  # the more confident first
    assert "| partial r |" not in table
    # no perturbation oriented an edge: every direction is the fit's, said once, no column for it
    assert "every direction is the fit's alone" in table and "| direction |" not in table
    # perturbations backed one direction: a column says whose each direction is
    adata.uns["cape"]["causal_graph"]["orientation"] = {
        "fdr": 0.05, "n_tested_pairs": 40, "n_shifted_pairs": 3, "n_removed_cycle_edges": 0,
        "n_edges_supported": 1, "n_edges_turned": 0, "supported_source": np.array([genes[0]], dtype=object),
        "supported_target": np.array([genes[1]], dtype=object), "turned_source": np.array([], dtype=object),
        "turned_target": np.array([], dtype=object)}
    table = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text().split(
        "## Strongest edges")[1]
    assert f"| {genes[0]} | {genes[1]} | +0.9 | 1.000 | solid | perturbations |" in table
    assert f"| {genes[1]} | {genes[4]} | +0.2 | 0.400 | guess | fit |" in table
    assert "*perturbations* where the shifts" in table and "every direction is the fit's alone" not in table
    del adata.uns["cape"]["causal_graph"]["orientation"]
    # equal confidences are ordered by the partial correlation's size, not by weight
    adata.varp["cape_dag_partial_correlation"] = sp.csr_matrix(np.where(dag == -0.5, -0.6, np.where(dag != 0, 0.3, 0)))
    table = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text().split(
        "## Strongest edges")[1]
    assert f"| {genes[2]} | {genes[3]} | -0.5 | -0.60 | 1.000 | solid |" in table
    assert table.index(f"| {genes[2]} | {genes[3]} |") < table.index(f"| {genes[0]} | {genes[1]} |")
    assert table.index(f"| {genes[0]} | {genes[1]} |") < table.index(f"| {genes[1]} | {genes[4]} |")
    # with the pairs' partial correlations given every gene, an edge ranks no higher than they rank it
    pair = np.where(dag == -0.5, -0.05, np.where(dag == 0.9, 0.4, np.where(dag != 0, 0.2, 0)))
    adata.varp["cape_dag_pair_partial_correlation"] = sp.csr_matrix(pair)
    table = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text().split(
        "## Strongest edges")[1]
    assert f"| {genes[2]} | {genes[3]} | -0.5 | -0.60 | -0.05 | 1.000 | solid |" in table and "r, all genes" in table
    assert table.index(f"| {genes[0]} | {genes[1]} |") < table.index(f"| {genes[2]} | {genes[3]} |")
    del adata.varp["cape_dag_pair_partial_correlation"]
    del adata.varp["cape_dag_confidence"], adata.varp["cape_dag_partial_correlation"]
    text = write_report(adata, records, tmp_path / "report.md", label_key="cell_type").read_text()
    assert "(no confidence stored)" in text
