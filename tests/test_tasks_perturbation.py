from __future__ import annotations

import itertools
import re

import anndata as ad
import numpy as np
import pandas as pd
import pytest

from cape import CapeInputError
from cape.data.perturbation_data import simulate_perturbation
from cape.tasks.perturbation import (
    SUBGROUPS,
    PerturbationTask,
    condition_genes,
    condition_means,
    downstream_de,
    simulation_split,
    to_gears_conditions,
    top_de_genes,
    top_de_mse,
    top_de_pearson_delta,
    validate_perturbation_data,
)
from cape.tasks.perturbation_predictors import (
    AdditivePredictor,
    EmbeddingPerturbationPredictor,
    NoChangePredictor,
    constant_gene_embeddings,
    dag_gene_embeddings,
    pca_gene_embeddings,
    permuted_gene_embeddings,
    random_gene_embeddings,
)
from cape_benchmarks.baselines import run_perturbation_benchmark


@pytest.fixture(scope="module")
def sim() -> ad.AnnData:
    return simulate_perturbation(n_genes=30, n_edges=50, n_control=120, n_cells_per_perturbation=20, n_single=16,
                                 n_double=24, seed=0)


def _conditions(n_genes=16, n_doubles=30, seed=0):
    genes = [f"g{i}" for i in range(n_genes)]
    pairs = list(itertools.combinations(genes, 2))
    rng = np.random.default_rng(seed)
    doubles = [f"{a}+{b}" for a, b in (pairs[i] for i in rng.choice(len(pairs), n_doubles, replace=False))]
    return [f"{g}+ctrl" for g in genes] + doubles


def test_condition_genes():
    assert condition_genes("ctrl") == ()
    assert condition_genes("A+ctrl") == ("A",)
    assert condition_genes("ctrl+A") == ("A",)
    assert condition_genes("A+B") == ("A", "B")
    with pytest.raises(CapeInputError, match="GEARS format.*to_gears_conditions converts"):
        condition_genes("A+B+C")


@pytest.mark.parametrize("seed", [1, 2, 7])
def test_simulation_split_matches_its_definition(seed):
    conds = _conditions()
    split = simulation_split(conds, seed=seed)
    train_all = split.train + split.val
    # A partition of all perturbations.
    assert sorted(train_all + split.test) == sorted(conds)
    assert not set(train_all) & set(split.test)
    # Seen genes = genes of the training singles; 75 % of the 16 perturbed genes.
    seen = {condition_genes(c)[0] for c in train_all if len(condition_genes(c)) == 1}
    assert len(seen) == 12
    for c in train_all:  # training holds only seen genes
        assert set(condition_genes(c)) <= seen
    for c in split.test:
        g = condition_genes(c)
        k = sum(x in seen for x in g)
        expected = "unseen_single" if len(g) == 1 else f"combo_seen{k}"
        assert split.subgroup[c] == expected
    seen2 = [c for c in conds if len(condition_genes(c)) == 2 and set(condition_genes(c)) <= seen]
    assert sum(c in train_all for c in seen2) == int(len(seen2) * 0.75)
    assert set(split.test_by_subgroup()) == set(SUBGROUPS)


def test_simulation_split_is_deterministic_and_order_free():
    conds = _conditions()
    a = simulation_split(conds, seed=1)
    b = simulation_split([*reversed(conds), "ctrl"], seed=1)
    assert (a.train, a.val, a.test, a.subgroup) == (b.train, b.val, b.test, b.subgroup)
    c = simulation_split(conds, seed=2)
    assert a.test != c.test


def test_simulation_split_validation_carved_from_train():
    split = simulation_split(_conditions(n_genes=20, n_doubles=40), seed=1)
    assert split.val and split.train
    assert not set(split.val) & set(split.train)


def test_split_too_small_is_a_clear_error():
    with pytest.raises(CapeInputError, match="too few perturbed genes"):
        simulation_split(["A+ctrl"], seed=1)
    with pytest.raises(CapeInputError, match="too few perturbed genes"):
        simulation_split(["A+ctrl", "ctrl"], seed=1)


def _toy(n_ctrl=40, n_pert=20, seed=0) -> ad.AnnData:
    """5 genes; A+ctrl lowers gene A strongly and B a bit; B+ctrl raises C; A+B both."""
    rng = np.random.default_rng(seed)
    base = np.array([3.0, 2.0, 1.0, 1.5, 2.5])
    shift = {"ctrl": 0, "A+ctrl": np.array([-2.5, -0.5, 0, 0, 0]), "B+ctrl": np.array([0, 0, 1.2, 0, 0]),
             "A+B": np.array([-2.5, -0.5, 1.2, 0.6, 0])}
    blocks, labels = [], []
    for cond, n in (("ctrl", n_ctrl), ("A+ctrl", n_pert), ("B+ctrl", n_pert), ("A+B", n_pert)):
        blocks.append(np.clip(base + shift[cond] + rng.normal(0, 0.2, size=(n, 5)), 0, None))
        labels += [cond] * n
    adata = ad.AnnData(np.vstack(blocks).astype(np.float32),
                       obs=pd.DataFrame({"condition": pd.Categorical(labels)}, index=[f"c{i}" for i in
                                                                                       range(len(labels))]),
                       var=pd.DataFrame(index=["A", "B", "C", "D", "E"]))
    return adata


def test_top_de_genes_rank_by_absolute_change():
    adata = _toy()
    de = top_de_genes(adata, ["A+ctrl", "B+ctrl"], n_genes=2)
    assert de["A+ctrl"][0] == "A" and de["A+ctrl"][1] == "B"
    assert de["B+ctrl"][0] == "C"
    assert "rank_genes_groups" not in adata.uns  # input untouched


def test_top_de_mse_brute_force():
    rng = np.random.default_rng(0)
    genes = list("abcdef")
    truth = pd.DataFrame(rng.normal(size=(3, 6)), index=["x", "y", "z"], columns=genes)
    pred = pd.DataFrame(rng.normal(size=(3, 6)), index=["x", "y", "z"], columns=genes)
    de = {"x": ["a", "c"], "y": ["f"], "z": genes}
    got = top_de_mse(pred, truth, de)
    for cond, gs in de.items():
        brute = sum((pred.loc[cond, g] - truth.loc[cond, g]) ** 2 for g in gs) / len(gs)
        assert got[cond] == pytest.approx(brute)
    assert top_de_mse(truth, truth, de).max() == 0


def test_baselines_on_toy():
    adata = _toy()
    ctrl = condition_means(adata, ["ctrl"]).iloc[0]
    means = condition_means(adata, ["A+ctrl", "B+ctrl"])
    nochange = NoChangePredictor().fit(adata, ["A+ctrl", "B+ctrl"]).predict(["A+B", "C+ctrl"])
    np.testing.assert_allclose(nochange.loc["A+B"], ctrl)
    add = AdditivePredictor().fit(adata, ["A+ctrl", "B+ctrl"]).predict(["A+B", "A+ctrl", "C+ctrl", "A+C"])
    np.testing.assert_allclose(add.loc["A+B"], means.loc["A+ctrl"] + means.loc["B+ctrl"] - ctrl)
    np.testing.assert_allclose(add.loc["A+ctrl"], means.loc["A+ctrl"])
    np.testing.assert_allclose(add.loc["C+ctrl"], ctrl)  # unseen gene: no shift
    np.testing.assert_allclose(add.loc["A+C"], means.loc["A+ctrl"])


def test_embedding_predictor_is_seeded_and_learns(sim):
    conds = validate_perturbation_data(sim)
    split = simulation_split(conds, seed=1)
    emb = pca_gene_embeddings(sim, 8)
    kw = {"epochs": 150, "hidden": 32}
    a = EmbeddingPerturbationPredictor(emb, seed=0, **kw).fit(sim, split.train)
    b = EmbeddingPerturbationPredictor(emb, seed=0, **kw).fit(sim, split.train)
    pa, pb = a.predict(split.test), b.predict(split.test)
    pd.testing.assert_frame_equal(pa, pb)
    assert a.losses_[-1] < 0.5 * a.losses_[0]
    # It fits its training perturbations far better than "no change" does.
    truth = condition_means(sim, split.train)
    fit = a.predict(split.train)
    nochange = NoChangePredictor().fit(sim, split.train).predict(split.train)
    assert ((fit - truth) ** 2).to_numpy().mean() < 0.5 * ((nochange - truth) ** 2).to_numpy().mean()


def test_pearson_delta_brute_force_and_no_variation_is_zero():
    from scipy.stats import pearsonr

    rng = np.random.default_rng(1)
    genes = list("abcdefg")
    control = pd.Series(rng.normal(size=7), index=genes)
    truth = pd.DataFrame(rng.normal(size=(2, 7)), index=["x", "y"], columns=genes)
    pred = pd.DataFrame(rng.normal(size=(2, 7)), index=["x", "y"], columns=genes)
    de = {"x": ["a", "c", "d", "g"], "y": genes}
    got = top_de_pearson_delta(pred, truth, control, de)
    for cond, gs in de.items():
        want = pearsonr(pred.loc[cond, gs] - control[gs], truth.loc[cond, gs] - control[gs])[0]
        assert got[cond] == pytest.approx(want)
    flat = pd.DataFrame(np.tile(control.to_numpy(), (2, 1)), index=["x", "y"], columns=genes)  # no change
    assert (top_de_pearson_delta(flat, truth, control, de) == 0).all()
    np.testing.assert_allclose(top_de_pearson_delta(truth, truth, control, de), 1.0)


def test_uninformative_embeddings_cannot_beat_no_change_or_informative_ones(sim):
    task = PerturbationTask.build(sim)
    kw = {"epochs": 150, "hidden": 32, "seed": 0}
    nochange = NoChangePredictor().fit(sim, task.train).predict(task.split.test)
    constant = EmbeddingPerturbationPredictor(constant_gene_embeddings(sim.n_vars, 8), **kw).fit(sim, task.train)
    # no part of the prediction bypasses the embeddings: constant ones predict exactly "no change"
    pd.testing.assert_frame_equal(constant.predict(task.split.test), nochange, atol=1e-6, rtol=0)
    scores = {name: task.score(EmbeddingPerturbationPredictor(emb, **kw)) for name, emb in {
        "constant": constant_gene_embeddings(sim.n_vars, 8),
        "oracle": dag_gene_embeddings(sim.varp["true_dag"], 8),
        "permuted": permuted_gene_embeddings(dag_gene_embeddings(sim.varp["true_dag"], 8), seed=0)}.items()}
    assert scores["constant"]["pearson_delta_overall"] == 0.0
    assert scores["oracle"]["pearson_delta_overall"] > scores["permuted"]["pearson_delta_overall"]
    assert scores["oracle"]["pearson_delta_overall"] > 0.2
    assert scores["constant"]["mse_single"] == pytest.approx(task.score(NoChangePredictor())["mse_single"])


def test_embedding_predictor_rejects_wrong_shape(sim):
    with pytest.raises(CapeInputError, match="gene embeddings have 5 rows"):
        EmbeddingPerturbationPredictor(np.zeros((5, 3))).fit(sim, ["G1+ctrl"])
    with pytest.raises(CapeInputError, match="finite 2-D"):
        EmbeddingPerturbationPredictor(np.full((30, 2), np.nan))


def test_benchmark_records(sim):
    recs = run_perturbation_benchmark(sim, dataset="sim",
                                      gene_embeddings={"random": random_gene_embeddings(sim.n_vars, 8)},
                                      predictor_kwargs={"epochs": 60, "hidden": 16})
    frame = pd.DataFrame(recs)
    assert set(frame["method"]) == {"no_change", "train_mean", "additive", "linear", "embedding_mlp[random]"}
    assert set(frame["subgroup"]) == {"overall", *SUBGROUPS}
    assert set(frame["metric"]) == {"top20_de_mse", "top20_de_pearson_delta"}
    ok = frame.dropna(subset=["value"])
    assert (ok.loc[ok["metric"] == "top20_de_mse", "value"] >= 0).all()
    assert ok.loc[ok["metric"] != "top20_de_mse", "value"].abs().max() <= 1
    # no change predicts no delta: no correlation
    nochange = frame[(frame["method"] == "no_change") & (frame["metric"] == "top20_de_pearson_delta")]
    assert (nochange["value"].dropna() == 0).all()
    frame = frame[frame["metric"] == "top20_de_mse"]
    # Additive equals no change on unseen singles and combos with no seen gene (no shift to add).
    pivot = frame.pivot_table(index="method", columns="subgroup", values="value")
    for g in ("unseen_single", "combo_seen0"):
        if not np.isnan(pivot.loc["no_change", g]):
            assert pivot.loc["additive", g] == pytest.approx(pivot.loc["no_change", g])


# ---------------------------------------------------------------------------------------------- bad input
def test_missing_condition_column():
    adata = _toy()
    del adata.obs["condition"]
    with pytest.raises(CapeInputError, match=r"obs\['condition'\] not found"):
        validate_perturbation_data(adata)


def test_no_control_cells():
    adata = _toy()
    adata.obs["condition"] = adata.obs["condition"].astype(str).replace("ctrl", "D+ctrl")
    with pytest.raises(CapeInputError, match="no control cells"):
        validate_perturbation_data(adata)


def test_conditions_naming_absent_genes_are_listed():
    adata = _toy()
    labels = adata.obs["condition"].astype(str).to_numpy()
    labels[-3:] = "X9+ctrl"
    labels[-6:-3] = "A+Y7"
    adata.obs["condition"] = labels
    with pytest.raises(CapeInputError, match="2 gene\\(s\\) absent from the data: .*X9.*Y7|Y7.*X9"):
        validate_perturbation_data(adata)


def test_condition_with_one_cell_is_excluded_with_warning():
    adata = _toy()
    labels = adata.obs["condition"].astype(str).to_numpy()
    labels[-1] = "C+ctrl"
    adata.obs["condition"] = labels
    with pytest.warns(UserWarning, match="fewer than 2 cells excluded: C\\+ctrl"):
        usable = validate_perturbation_data(adata)
    assert "C+ctrl" not in usable and "A+ctrl" in usable


def test_dag_gene_embeddings_separate_descendant_sets():
    from cape.tasks.perturbation_predictors import dag_gene_embeddings

    # 0 → 1 → 2 and 3 → 4: full-rank SVD reproduces the reachability matrix exactly.
    adj = np.zeros((5, 5))
    adj[0, 1] = adj[1, 2] = adj[3, 4] = 1.0
    emb = dag_gene_embeddings(adj, d=10)
    assert emb.shape == (5, 10)
    out, inn = emb[:, :5], emb[:, 5:]
    reach = np.array([[0, 1, 1, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]], float)
    np.testing.assert_allclose(out @ inn.T, reach, atol=1e-10)


#: Output of cell-gears 0.1.2 ``DataSplitter.get_simulation_split(_conditions(), 0.75, 0.75, seed=1)`` (run once in a
#: separate environment; GEARS is not a dependency): the reimplementation must reproduce it exactly.
GEARS_0_1_2_SEED1 = {
    "train": [
        "g0+ctrl", "g0+g1", "g0+g4", "g0+g8", "g1+ctrl", "g1+g12", "g1+g4", "g10+ctrl", "g11+ctrl", "g12+ctrl",
        "g14+ctrl", "g15+ctrl", "g3+ctrl", "g3+g7", "g3+g9", "g4+ctrl", "g4+g15", "g7+ctrl", "g7+g15", "g8+ctrl",
        "g8+g10", "g9+ctrl", "g9+g10", "g9+g12"
    ],
    "test": [
        "g0+g2", "g10+g11", "g10+g13", "g13+ctrl", "g13+g14", "g13+g15", "g2+ctrl", "g2+g3", "g2+g4", "g3+g13",
        "g4+g12", "g4+g14", "g4+g9", "g5+ctrl", "g5+g6", "g5+g8", "g6+ctrl", "g6+g13", "g6+g7", "g6+g9", "g7+g11",
        "g9+g13"
    ],
    "subgroup": {
        "combo_seen0": ["g5+g6", "g6+g13"],
        "combo_seen1": [
            "g0+g2", "g10+g13", "g13+g14", "g13+g15", "g2+g3", "g2+g4", "g3+g13", "g5+g8", "g6+g7", "g6+g9",
            "g9+g13"
        ],
        "combo_seen2": ["g10+g11", "g4+g12", "g4+g14", "g4+g9", "g7+g11"],
        "unseen_single": ["g13+ctrl", "g2+ctrl", "g5+ctrl", "g6+ctrl"],
    },
}


def test_simulation_split_reproduces_gears():
    split = simulation_split(_conditions(), seed=1)
    assert sorted(split.train + split.val) == GEARS_0_1_2_SEED1["train"]
    assert sorted(split.test) == GEARS_0_1_2_SEED1["test"]
    for group, conds in GEARS_0_1_2_SEED1["subgroup"].items():
        assert sorted(split.test_by_subgroup()[group]) == conds


def test_downstream_scores_leave_the_perturbed_genes_out(sim):
    task = PerturbationTask.build(sim)
    downstream = downstream_de(task.de)
    for cond, genes in downstream.items():
        assert set(genes) == set(task.de[cond]) - set(condition_genes(cond))
    scores = task.score(AdditivePredictor())
    assert {"mse_downstream_overall", "pearson_delta_downstream_overall"} <= set(scores)
    truth_only = task.score(NoChangePredictor())
    assert truth_only["pearson_delta_downstream_overall"] == 0.0


# ---------------------------------------------------------------------------------------------- label spellings
CONTROL_SPELLINGS = ["ctrl", "CTRL", "control", "Control", "non-targeting", "Non-Targeting", "NT", "nt",
                     "non_targeting", "negative_control", "NEGATIVE-CONTROL", "unperturbed"]
SPELLINGS = {  # label → GEARS condition, without genes=
    "A": "A+ctrl", "A+ctrl": "A+ctrl", "ctrl+A": "ctrl+A", "A_ctrl": "A+ctrl", "A+non-targeting": "A+ctrl",
    "A+B": "A+B", "A_B": "A+B", "A|B": "A+B", "A,B": "A+B", "A;B": "A+B", " A , B ": "A+B", "B_A": "B+A",
    "HLA-A": "HLA-A+ctrl", "HLA-A_B": "HLA-A+B", "NKX2-1|A": "NKX2-1+A", "Sox2": "Sox2+ctrl", "SGK1": "SGK1+ctrl",
}


@pytest.mark.parametrize("label", CONTROL_SPELLINGS)
def test_control_spellings_become_ctrl(label):
    assert to_gears_conditions([label]).tolist() == ["ctrl"]


@pytest.mark.parametrize(("label", "want"), SPELLINGS.items())
def test_each_spelling_becomes_its_gears_condition(label, want):
    got = to_gears_conditions([label]).iloc[0]
    assert got == want
    assert condition_genes(got) == tuple(g for g in want.split("+") if g != "ctrl")


def test_conversion_is_idempotent_and_keeps_the_index():
    labels = pd.Series([*CONTROL_SPELLINGS, *SPELLINGS], index=[f"cell{i}" for i in range(29)], name="guide")
    once = to_gears_conditions(labels)
    assert list(once.index) == list(labels.index) and once.name == "condition"
    pd.testing.assert_series_equal(to_gears_conditions(once), once)
    genes = ["A", "B", "HLA-A", "NKX2-1", "Sox2", "SGK1"]
    pd.testing.assert_series_equal(to_gears_conditions(once, genes), to_gears_conditions(labels, genes))
    assert set(once) <= {"ctrl", *SPELLINGS.values(), "A+B"}


def test_one_perturbation_spelled_two_ways_gets_one_condition():
    got = to_gears_conditions(["B_A", "A+B", "ctrl+C", "C", "D|E", "ctrl+F"]).tolist()
    # both orders of a pair → sorted; both positions of ctrl → A+ctrl; a single spelling is kept
    assert got == ["A+B", "A+B", "C+ctrl", "C+ctrl", "D+E", "ctrl+F"]


def test_genes_decide_where_underscores_split():
    genes = ["NKX2_1", "A", "B", "HLA-A"]
    got = to_gears_conditions(["NKX2_1", "NKX2_1_A", "A_B", "A_ctrl", "HLA-A+NKX2_1"], genes=genes).tolist()
    assert got == ["NKX2_1+ctrl", "NKX2_1+A", "A+B", "A+ctrl", "HLA-A+NKX2_1"]
    with pytest.raises(CapeInputError, match=r"'A_B' \('A_B' splits into genes in 2 ways\)"):
        to_gears_conditions(["A_B"], genes=["A", "B", "A_B"])
    with pytest.raises(CapeInputError, match=r"'A\+X9' \('X9' is not a gene of the data\)"):
        to_gears_conditions(["A+X9"], genes=genes)
    with pytest.raises(CapeInputError, match="'1' is not a gene symbol.*pass genes=adata.var_names"):
        to_gears_conditions(["NKX2_1"])


@pytest.mark.parametrize(("labels", "why"), [
    (["sgA_1"], "'sgA' is not a gene symbol"), (["A_sg2"], "'sg2' is not a gene symbol"),
    (["A_guide3"], "'guide3' is not a gene symbol"), ([""], "an empty part"), (["A+"], "an empty part"),
    (["A||B"], "an empty part"), ([None], "a missing label"), ([np.nan], "a missing label"),
    (["A+B+C"], "more than two target genes"), (["A_B_C"], "more than two target genes"),
    (["A+A"], "the same gene twice"), (["7"], "'7' is not a gene symbol"),
])
def test_unreadable_labels_are_refused(labels, why):
    with pytest.raises(CapeInputError, match=re.escape(why)) as err:
        to_gears_conditions(["ctrl", "A", *labels])
    assert "\n" not in str(err.value) and "'A+ctrl' or 'A+B'" in str(err.value)


def test_refusal_names_at_most_three_labels_and_counts_all():
    with pytest.raises(CapeInputError, match=r"^5 perturbation label\(s\)") as err:
        to_gears_conditions(["sgA_1", "sgA_2", "sgB_1", "sgB_2", "", "A", "ctrl"])
    message = str(err.value)
    assert "'sgA_1'" in message and "'sgB_1'" in message and "'sgB_2'" not in message
