"""GEARS fed gene embeddings (cape.tasks.gears, cape.tasks.gears_inputs): GO-graph replacement, embedding tables,
offline errors, and one tiny GEARS training run shared by several checks. Needs the optional 'gears' extra.
"""

from __future__ import annotations

import importlib.util
import itertools
import pickle
import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch

from cape import CapeInputError
from cape.tasks.gears import run_gears
from cape.tasks.gears_inputs import (
    _read_go_graph,
    dag_gene2go,
    embedding_tables,
    fit_embedding_width,
    go_edge_list,
)
from cape.tasks.perturbation import simulation_split

# Looked up, not imported: importing GEARS compiles dcor's numba code, which belongs in a test rather than in the
# collection, where a crash loses the pytest worker before any test has run.
pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(name) is None for name in ("gears", "torch_geometric")),
                                reason="needs the optional 'gears' extra (cell-gears, torch_geometric)")

HIDDEN = 16


@pytest.fixture(scope="module")
def embeddings(tiny_perturbation):
    return np.random.default_rng(3).normal(size=(tiny_perturbation.n_vars, 6))


@pytest.fixture(scope="module")
def frozen_run(tiny_perturbation, embeddings, tmp_path_factory):
    """One GEARS run (1 epoch) with frozen embeddings and the DAG replacement of GO; global state recorded."""
    workdir = tmp_path_factory.mktemp("gears")
    np_state = np.random.get_state()  # noqa: NPY002  (GEARS uses the legacy global generator)
    filters = list(warnings.filters)
    torch_state = torch.random.get_rng_state()
    result = run_gears(tiny_perturbation, embeddings, go_graph="dag", epochs=1, hidden_size=HIDDEN, batch_size=16,
                       device="cpu", seed=0, workdir=workdir)
    after = {"np_equal": np.array_equal(np.random.get_state()[1], np_state[1]),  # noqa: NPY002
             "filters_equal": list(warnings.filters) == filters,
             "torch_equal": torch.equal(torch.random.get_rng_state(), torch_state)}
    return result, workdir, after


# ---------------------------------------------------------------------------------------------------------------
# GO graph
# ---------------------------------------------------------------------------------------------------------------
def test_go_edge_list_equals_gears_jaccard_and_top_k():
    from gears.utils import get_GO_edge_list

    rng = np.random.default_rng(0)
    gene2go = {f"g{i}": {f"t{j}" for j in rng.choice(12, size=rng.integers(1, 6), replace=False)}
               for i in range(15)}
    k = 3
    ours = go_edge_list(gene2go, k=k)
    # GEARS' own (quadratic) scoring, then its "k + 1 largest per target"
    brute = pd.DataFrame([e for g in gene2go for e in get_GO_edge_list((g, gene2go))],
                         columns=["source", "target", "importance"])
    for target, sub in ours.groupby("target"):
        expected = brute[brute["target"] == target]
        assert len(sub) == min(k + 1, len(expected))
        # the kept scores are the k + 1 largest (ties may pick different genes, never different scores)
        assert np.allclose(np.sort(sub["importance"])[::-1], np.sort(expected["importance"])[::-1][:len(sub)])
        for s, imp in zip(sub["source"], sub["importance"], strict=True):
            a, b = gene2go[s], gene2go[target]
            assert imp == pytest.approx(len(a & b) / len(a | b))
    assert (ours["importance"] > 0.1).all()
    assert set(ours["target"]) == set(gene2go)  # every gene keeps at least its self-loop (importance 1)


def test_dag_gene2go_is_closed_undirected_neighbourhood():
    a = np.zeros((4, 4))
    a[0, 1] = 0.5  # 0 → 1
    a[2, 1] = -1.0  # 2 → 1
    names = ["A", "B", "C", "D"]
    g2g = dag_gene2go(sp.csr_matrix(a), names)
    assert g2g == {"A": {"A", "B"}, "B": {"A", "B", "C"}, "C": {"B", "C"}, "D": {"D"}}
    edges = go_edge_list(g2g, k=20)
    score = {(s, t): v for s, t, v in edges.itertuples(index=False)}
    assert score[("A", "C")] == pytest.approx(1 / 3)  # siblings share their child
    assert score[("D", "D")] == 1.0 and ("A", "D") not in score
    with pytest.raises(CapeInputError, match="shape"):
        dag_gene2go(np.zeros((3, 3)), names)


def test_dag_go_file_written_in_gears_format(frozen_run, tiny_perturbation):
    _, workdir, _ = frozen_run
    go = pd.read_csv(workdir / "go_dag.csv")
    assert list(go.columns) == ["source", "target", "importance"]
    g2g = dag_gene2go(tiny_perturbation.varp["cape_dag"], list(tiny_perturbation.var_names))
    for s, t, v in go.itertuples(index=False):
        assert v == pytest.approx(len(g2g[s] & g2g[t]) / len(g2g[s] | g2g[t]))
    assert (go.groupby("target").size() <= 21).all()
    assert set(go.loc[go["source"] == go["target"], "importance"]) == {1.0}
    with (workdir / "cape_gears" / "gene2go_all.pkl").open("rb") as fh:  # where GEARS looks: it never downloads
        assert pickle.load(fh) == g2g


def test_offline_without_go_graph_is_one_line_error(tiny_perturbation, tmp_path):
    with pytest.raises(CapeInputError, match=r"gene2go_all\.pkl.*go\.csv.*'dag'") as err:
        run_gears(tiny_perturbation, go_graph=None, epochs=1, workdir=tmp_path)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "gene2go_all.pkl").exists()  # nothing faked


def test_go_inputs_validated(tiny_perturbation, tmp_path):
    bad = tmp_path / "go.csv"
    bad.write_text("gene1,gene2\nG0,G1\n")
    with pytest.raises(CapeInputError, match="source,target,importance"):
        run_gears(tiny_perturbation, go_graph=bad, epochs=1, workdir=tmp_path)
    partial = tmp_path / "partial.csv"
    partial.write_text("source,target,importance\nG0,G1,0.5\nG1,G0,0.5\n")
    with pytest.raises(CapeInputError, match="not in the GO graph"):
        run_gears(tiny_perturbation, go_graph=partial, epochs=1, workdir=tmp_path)
    with pytest.raises(CapeInputError, match="not found"):
        run_gears(tiny_perturbation, go_graph=tmp_path / "missing.pkl", epochs=1, workdir=tmp_path)
    with pytest.raises(CapeInputError, match="varp"):
        run_gears(tiny_perturbation, go_graph="dag", dag_key="nope", epochs=1, workdir=tmp_path)
    with pytest.raises(CapeInputError, match="rows"):
        run_gears(tiny_perturbation, np.zeros((3, 4)), go_graph="dag", epochs=1, workdir=tmp_path)
    with pytest.raises(CapeInputError, match="epochs must be a positive integer"):
        run_gears(tiny_perturbation, go_graph="dag", epochs=0, workdir=tmp_path)
    with pytest.raises(CapeInputError, match="unknown option 'epoch'.*did you mean 'epochs'"):
        run_gears(tiny_perturbation, go_graph="dag", epoch=1, workdir=tmp_path)


def test_go_csv_and_gene2go_pickle_inputs(tiny_perturbation, tmp_path):
    genes = list(tiny_perturbation.var_names)
    rows = [(a, b, 0.5) for a, b in itertools.product(genes, genes) if a != b][:300]
    path = tmp_path / "go.csv"
    pd.DataFrame(rows, columns=["source", "target", "importance"]).to_csv(path, index=False)
    gene2go, edges, note = _read_go_graph(path, tiny_perturbation, "cape_dag", tmp_path, False, k=2)
    assert note.startswith("go_csv") and (edges.groupby("target").size() <= 3).all()
    assert set(gene2go) == set(edges["source"]) | set(edges["target"])
    pkl = tmp_path / "g2g.pkl"
    with pkl.open("wb") as fh:
        pickle.dump({g: {"GO:1", g} for g in genes} | {"OTHER": {"GO:1"}}, fh)
    gene2go, edges, note = _read_go_graph(pkl, tiny_perturbation, "cape_dag", tmp_path, False, k=2)
    assert edges is None and note.startswith("gene2go") and set(gene2go) == set(genes)  # only the data's genes


# ---------------------------------------------------------------------------------------------------------------
# embeddings → GEARS tables
# ---------------------------------------------------------------------------------------------------------------
def test_fit_embedding_width_pads_or_projects_and_scales_into_unit_ball():
    rng = np.random.default_rng(1)
    small = rng.normal(size=(30, 5))
    padded = fit_embedding_width(small, 8)
    scale = padded[:, 0] / small[:, 0]
    assert np.allclose(scale, scale[0]) and np.allclose(padded[:, 5:], 0)
    assert np.linalg.norm(padded, axis=1).max() == pytest.approx(1 - 1e-6)
    # d > width: exact when the matrix has rank ≤ width (Gram matrix kept up to the common scale)
    low_rank = rng.normal(size=(30, 3)) @ rng.normal(size=(3, 12))
    proj = fit_embedding_width(low_rank, 4)
    gram, gram_proj = low_rank @ low_rank.T, proj @ proj.T
    assert np.allclose(gram_proj, gram * (gram_proj[0, 0] / gram[0, 0]), atol=1e-9)
    assert np.all(fit_embedding_width(np.zeros((3, 2)), 4) == 0)


def test_embedding_tables_follow_gears_orders():
    emb = np.arange(12, dtype=float).reshape(4, 3) + 1
    genes = ["a", "b", "c", "d"]
    gene_table, pert_table, has = embedding_tables(emb, genes, ["d", "a", "b", "c"], ["b", "x", "d"], 5)
    full = fit_embedding_width(emb, 5)
    assert np.allclose(gene_table, full[[3, 0, 1, 2]])
    assert has.tolist() == [True, False, True]
    assert np.allclose(pert_table[[0, 2]], full[[1, 3]]) and np.all(pert_table[1] == 0)


def test_embeddings_land_in_gears_tables_and_stay_frozen(frozen_run, tiny_perturbation, embeddings):
    result, _, _ = frozen_run
    model = result["model"]
    gene_table, pert_table, has = embedding_tables(embeddings, list(tiny_perturbation.var_names), model.gene_list,
                                                   model.pert_list, HIDDEN)
    assert result["embedding_rows"] == {"gene_emb": tiny_perturbation.n_vars, "pert_emb": int(has.sum())}
    for net in (model.model, model.best_model):  # after training: frozen, and GEARS' max_norm never rescaled
        assert not net.gene_emb.weight.requires_grad
        assert torch.allclose(net.gene_emb.weight, torch.as_tensor(gene_table, dtype=torch.float32))
        assert torch.allclose(net.pert_emb.weight[torch.as_tensor(has)],
                              torch.as_tensor(pert_table[has], dtype=torch.float32))


def test_trainable_embeddings_are_initialised_then_trained(tiny_perturbation, embeddings):
    result = run_gears(tiny_perturbation, embeddings, go_graph="dag", epochs=1, hidden_size=HIDDEN, batch_size=16,
                       device="cpu", trainable_embeddings=True)
    weight = result["model"].model.gene_emb.weight
    gene_table, _, _ = embedding_tables(embeddings, list(tiny_perturbation.var_names), result["model"].gene_list,
                                        result["model"].pert_list, HIDDEN)
    assert weight.requires_grad
    assert not torch.allclose(weight, torch.as_tensor(gene_table, dtype=torch.float32))


# ---------------------------------------------------------------------------------------------------------------
# predictions and scoring
# ---------------------------------------------------------------------------------------------------------------
def test_predictions_cover_gears_test_split_and_are_scored(frozen_run, tiny_perturbation):
    result, _, after = frozen_run
    split = result["split"]
    cape_split = simulation_split(tiny_perturbation.obs["condition"].astype(str).unique(), seed=1)
    assert result["split_matches_cape"]
    assert sorted(split.test) == sorted(cape_split.test) and split.subgroup == cape_split.subgroup
    predicted = result["predicted"]
    assert sorted(predicted.index) == sorted(split.test)
    assert list(predicted.columns) == list(tiny_perturbation.var_names)
    assert np.isfinite(predicted.to_numpy()).all()
    assert list(result["per_condition"].index) == list(split.test)
    metrics = result["metrics"]
    assert set(metrics) >= {"mse_overall", "mse_single", "mse_double", "mse_combo_seen1"}
    assert metrics["mse_overall"] == pytest.approx(result["per_condition"].mean())
    assert "not the paper's GEARS" in result["go_graph"]
    assert np.isfinite(result["best_val_top20_de_mse"])
    assert after == {"np_equal": True, "filters_equal": True, "torch_equal": True}  # GEARS' globals contained


def test_same_seed_same_predictions(frozen_run, tiny_perturbation, embeddings):
    again = run_gears(tiny_perturbation, embeddings, go_graph="dag", epochs=1, hidden_size=HIDDEN, batch_size=16,
                      device="cpu", seed=0)
    pd.testing.assert_frame_equal(again["predicted"], frozen_run[0]["predicted"])
