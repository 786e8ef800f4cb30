"""The backbone recipe: ``max_len="auto"`` and truncation reports, the cell-expression pretraining objective, the
unsupervised cell embedding of ``cape train``, clustering scored honestly, and ``cape-bench recipe``'s pieces."""

from __future__ import annotations

import logging
from pathlib import Path

import anndata as ad
import numpy as np
import pytest
import torch
import yaml
from _models_data import cape_adata, one_thread  # noqa: F401  (fixture)
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import adjusted_rand_score

from cape import CapeInputError
from cape.cli import main
from cape.models import CellTransformer
from cape.models.hyperparameters import TrainingRecipe
from cape.models.tokenize import (
    MAX_AUTO_LEN,
    CellDataset,
    GeneVocab,
    TokenizerConfig,
    collate_cells,
    covering_max_len,
    quantile_bin,
    truncation_summary,
)
from cape.models.training.objectives import PretrainingTask
from cape.report import evaluate_run
from cape.tasks.annotation import annotation_split
from cape.tasks.clustering import kmeans_clusters
from cape_benchmarks.recipe import ModelShape, paired_rows, recipe_run

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = dict(d_model=16, n_heads=2, n_layers=1, dropout=0.0)
SHAPE = ModelShape(d_model=16, n_layers=1, n_heads=2)


@pytest.fixture(scope="module")
def adata():
    return cape_adata(n_cells=45)


def expressed(adata) -> np.ndarray:
    x = adata[:, adata.var["cape_used"].to_numpy()].X
    return np.asarray((x > 0).sum(axis=1)).ravel()


# ------------------------------------------------------------------------------------------------ max_len
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=40), st.integers(2, 400))
@settings(max_examples=60, deadline=None)
def test_truncation_summary_counts_what_max_len_drops(tokens, max_len):
    s = truncation_summary(np.array(tokens), max_len)
    lost = [t - (max_len - 1) for t in tokens if t > max_len - 1]  # brute force
    assert s["n_cells_truncated"] == len(lost) and s["n_cells"] == len(tokens)
    assert s["max_genes_lost"] == (max(lost) if lost else 0)
    assert s["mean_genes_lost"] == pytest.approx(np.mean(lost) if lost else 0.0)
    assert s["covering_max_len"] == max(tokens) + 1
    assert truncation_summary(np.array(tokens), s["covering_max_len"])["n_cells_truncated"] == 0
    assert covering_max_len(np.array(tokens)) == min(max(max(tokens) + 1, 2), MAX_AUTO_LEN)


def test_tokens_per_cell_same_for_sparse_and_dense(adata):
    vocab = GeneVocab.from_genes(adata.var_names)
    ids = vocab.lookup(adata.var_names)
    dense = CellDataset(adata.X.toarray(), ids, vocab, TokenizerConfig(max_len=8))
    x = adata.X.copy()
    x.data[::7] = 0.0  # explicit zeros in a sparse matrix are not expressed genes
    sparse, dense_zeros = CellDataset(x, ids, vocab, TokenizerConfig()), CellDataset(x.toarray(), ids, vocab,
                                                                                     TokenizerConfig())
    assert np.array_equal(dense.tokens_per_cell(), np.asarray((adata.X > 0).sum(1)).ravel())
    assert np.array_equal(sparse.tokens_per_cell(), dense_zeros.tokens_per_cell())
    everything = CellDataset(x, ids, vocab, TokenizerConfig(include_zero_genes=True))
    assert set(everything.tokens_per_cell()) == {adata.n_vars}


def test_max_len_auto_keeps_every_expressed_gene(adata, caplog):
    model = CellTransformer(adata, "scgpt", "cape", **TINY, seed=0)
    assert model.tokenizer.max_len == expressed(adata).max() + 1
    with caplog.at_level(logging.WARNING, logger="cape"):
        model.get_latent_representation(adata)
    assert "truncates" not in caplog.text and model.truncation["n_cells_truncated"] == 0


def test_a_truncating_max_len_says_how_many_cells_lose_how_many_genes(adata, caplog):
    model = CellTransformer(adata, "scgpt", "cape", **TINY, max_len=6, seed=0)
    counts = expressed(adata)
    with caplog.at_level(logging.WARNING, logger="cape"):
        model.get_latent_representation(adata)
        model.get_latent_representation(adata)
    cut = counts > 5
    assert f"truncates {cut.sum()} of {adata.n_obs} cells" in caplog.text
    assert f"max_len {counts.max() + 1} (or 'auto')" in caplog.text
    assert caplog.text.count("truncates") == 1  # once per outcome, not per pass
    assert model.truncation["max_genes_lost"] == counts.max() - 5


def test_max_len_is_refused_when_not_auto_or_a_length():
    for bad in ("long", 1, 2.5, True):
        with pytest.raises(CapeInputError, match="max_len"):
            TokenizerConfig(max_len=bad)


# ------------------------------------------------------------------------------------------------ cell objective
def test_cell_values_are_the_binned_profile_zeros_included(adata):
    vocab = GeneVocab.from_genes(adata.var_names[::-1])  # vocabulary order differs from the matrix
    ids = vocab.lookup(adata.var_names)
    data = CellDataset(adata.X, ids, vocab, TokenizerConfig(max_len=4), cell_targets=True)
    item = data[3]
    assert np.array_equal(item["cell_values"], quantile_bin(adata.X[3].toarray().ravel()))
    assert np.array_equal(data.target_ids, ids)
    assert (item["cell_values"] == 0).any()  # unexpressed genes are targets too, although never tokens
    batch = collate_cells([data[0], data[1]], pad_id=vocab.pad_id)
    assert batch["cell_values"].shape == (2, adata.n_vars)


def test_pretraining_loss_is_masked_values_plus_weighted_cell_profile(adata):
    model = CellTransformer(adata, "scgpt", "cape", **TINY, seed=0)
    model.pretrain(adata, epochs=1, batch_size=16, validation_fraction=0.0, cell_weight=0.5)
    data = model._dataset(adata, mask_ratio=0.3, cell_targets=True)
    batch = collate_cells([data[i] for i in range(8)], pad_id=model.vocab.pad_id)
    scale = model._value_scale()
    both = PretrainingTask(model.backbone, model.expr_head, scale, cell_head=model.cell_head,
                           target_ids=data.target_ids, cell_weight=0.5).eval()
    masked = PretrainingTask(model.backbone, model.expr_head, scale).eval()
    with torch.no_grad():
        hidden = model.backbone(batch["gene_ids"], batch["masked_values"], batch["padding_mask"])
        profile = model.cell_head(hidden[:, 0])[:, torch.as_tensor(data.target_ids)]
        cell = ((profile - batch["cell_values"] / scale) ** 2).mean(dim=1).mean()
        assert float(both(batch)) == pytest.approx(float(masked(batch)) + 0.5 * float(cell), rel=1e-5)


def test_cell_head_is_saved_and_loaded(adata, tmp_path):
    model = CellTransformer(adata, "scgpt", "cape", **TINY, seed=0)
    model.pretrain(adata, epochs=2, batch_size=16, validation_fraction=0.0)
    assert model.cell_head is not None
    loaded = CellTransformer.load(model.save(tmp_path / "m"), adata, device="cpu")
    assert loaded.cell_head is not None
    for a, b in zip(model.cell_head.state_dict().values(), loaded.cell_head.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert np.allclose(model.get_latent_representation(adata), loaded.get_latent_representation(adata))


def test_cell_weight_zero_is_masked_values_only_and_bad_weights_are_refused(adata):
    model = CellTransformer(adata, "scgpt", "cape", **TINY, seed=0)
    model.pretrain(adata, epochs=1, batch_size=16, validation_fraction=0.0, cell_weight=0.0)
    assert model.cell_head is None and "cell_head" not in model.module
    for bad in (-1.0, float("nan")):
        with pytest.raises(CapeInputError, match="cell_weight"):
            model.pretrain(adata, epochs=1, cell_weight=bad)


def test_cell_objective_puts_the_cell_type_into_the_cls_state():
    """Masked values alone leave <cls> without a gradient; the profile objective gives it the cell's content."""
    data = cape_adata(n_cells=90, seed=3)
    y = data.obs["cell_type"].astype(str).to_numpy()
    aris = {}
    for weight in (0.0, 1.0):
        model = CellTransformer(data, "scgpt", "none", **TINY, seed=0)
        model.pretrain(data, epochs=40, batch_size=16, lr=3e-3, validation_fraction=0.0, cell_weight=weight)
        emb = model.get_latent_representation(data, pooling="cls")
        aris[weight] = adjusted_rand_score(y, kmeans_clusters(emb, 3, seed=0))
    assert aris[1.0] > 0.9 and aris[1.0] > aris[0.0] + 0.3


# ------------------------------------------------------------------------------------------------ cape train
def _train(tmp_path, *extra):
    path = tmp_path / "in.h5ad"
    cape_adata(n_cells=40).write_h5ad(path)
    out = tmp_path / "trained.h5ad"
    assert main(["--quiet", "train", "-i", str(path), "-o", str(out), "--label-key", "cell_type", "--epochs", "1",
                 "--d-model", "16", "--n-heads", "2", *extra]) == 0
    return ad.read_h5ad(out)


def test_cape_train_keeps_the_embedding_from_before_the_labels(tmp_path):
    result = _train(tmp_path, "--pretrain-epochs", "1")
    assert result.uns["cape"]["model"]["embedding"] == "pretrained"
    assert result.obsm["X_cape"].shape == result.obsm["X_cape_fine_tuned"].shape == (40, 16)
    assert not np.allclose(result.obsm["X_cape"], result.obsm["X_cape_fine_tuned"])
    records = evaluate_run(result, "cell_type")
    methods = {r["method"] for r in records if r["task"] == "clustering"}
    assert methods == {"cape", "cape_fine_tuned", "pca_kmeans"}
    compared = {r["method"] for r in records if r["task"] == "comparison"}
    assert "clustering ARI: cape vs pca_kmeans" in compared  # the unsupervised embedding against PCA
    assert not any("cape_fine_tuned" in m for m in compared)


def test_without_pretraining_the_clustering_is_labelled_supervised(tmp_path):
    result = _train(tmp_path, "--pretrain-epochs", "0")
    assert result.uns["cape"]["model"]["embedding"] == "fine_tuned"
    records = evaluate_run(result, "cell_type")
    assert {r["method"] for r in records if r["task"] == "clustering"} == {"cape_fine_tuned", "pca_kmeans"}
    assert "clustering ARI: cape_fine_tuned vs pca_kmeans" in {r["method"] for r in records}


def test_cape_train_max_len_option(tmp_path, capsys):
    result = _train(tmp_path, "--pretrain-epochs", "0", "--max-len", "auto")
    assert result.uns["cape"]["model"]["tokenizer"]["max_len"] == expressed(cape_adata(n_cells=40)).max() + 1
    with pytest.raises(SystemExit):
        main(["train", "-i", "x.h5ad", "-o", str(tmp_path / "o.h5ad"), "--max-len", "long"])
    assert "expected 'auto' or a whole number" in capsys.readouterr().err


def test_default_pretraining_runs_every_epoch_and_keeps_the_best(adata):
    # Early stopping on the validation plateau of the first epochs left <cls> without cell structure: the default
    # runs every epoch (the workflow's train.patience is null, cape train's --patience has no default).
    assert TrainingRecipe().pretrain_patience is None
    model = CellTransformer(adata, "scgpt", "none", seed=0, device="cpu", **TINY)
    history = model.pretrain(adata, epochs=4, lr=1e-6, early_stopping_patience=TrainingRecipe().pretrain_patience)
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]
    config = yaml.safe_load(open(Path(__file__).parents[1] / "configs" / "config.yaml"))
    assert config["train"]["patience"] is None


def test_cape_train_refuses_a_patience_below_one(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "-i", "x.h5ad", "-o", str(tmp_path / "o.h5ad"), "--patience", "0"])
    assert "expected a positive integer" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ bench recipe
def test_recipe_run_scores_test_cells_and_reads_the_unsupervised_embedding(adata):
    labels = adata.obs["cell_type"].astype(str)
    split = annotation_split(labels.to_numpy(), seed=0)
    recipe = TrainingRecipe(pretrain_epochs=1, epochs=1, max_len="auto")
    metrics, predicted, embedding, kind = recipe_run(adata, "cell_type", recipe, split, 0, shape=SHAPE)
    assert predicted.shape == split.test.shape and kind == "unsupervised" and embedding.shape == (adata.n_obs, 16)
    assert metrics["accuracy"] == pytest.approx(np.mean(predicted == labels.to_numpy()[split.test]))
    assert metrics["epochs_pretrain"] == 1 and metrics["epochs_fine_tune"] == 1
    _, _, _, kind = recipe_run(adata, "cell_type", TrainingRecipe(pretrain_epochs=0, epochs=1), split, 0,
                               shape=SHAPE)
    assert kind == "supervised"


def test_paired_rows_are_per_seed_differences():
    records = [{"task": "annotation", "dataset": "d", "method": m, "seed": s, "metric": "accuracy", "value": v}
               for s, (a, b) in enumerate([(0.8, 0.7), (0.75, 0.7), (0.9, 0.8)])
               for m, v in (("current", a), ("logreg_pca", b))]
    row = paired_rows(records).iloc[0]
    d = np.array([0.1, 0.05, 0.1])
    assert row["comparison"] == "current − logreg_pca" and row["difference"] == pytest.approx(d.mean())
    half = 4.302652729911275 * d.std(ddof=1) / np.sqrt(3)  # t_{0.975, 2}
    assert row["low"] == pytest.approx(d.mean() - half) and row["verdict"] == "better"


def test_paired_rows_read_fewer_seconds_as_better():
    records = [{"task": "annotation", "dataset": "d", "method": m, "seed": s, "metric": "seconds", "value": v}
               for s, (a, b) in enumerate([(60.0, 90.0), (55.0, 80.0), (70.0, 95.0)])
               for m, v in (("current", a), ("long_schedule", b))]
    row = paired_rows(records).iloc[0]
    assert row["comparison"] == "current − long_schedule" and row["difference"] < 0 and row["verdict"] == "better"


def test_paired_rows_name_a_supervised_clustering():
    records = [{"task": "clustering", "dataset": "d", "method": m, "seed": s, "metric": k, "value": v}
               for s in range(3) for m, k, v in (("previous", "ARI", 0.5 + s / 10), ("previous", "unsupervised", 0.0),
                                                 ("current", "ARI", 0.4), ("current", "unsupervised", 1.0),
                                                 ("pca_kmeans", "ARI", 0.45))]
    comparisons = set(paired_rows(records)["comparison"])
    assert comparisons == {"current − pca_kmeans", "current − previous (supervised)",
                           "previous (supervised) − pca_kmeans"}


def test_recipe_run_is_the_same_for_the_same_seed(adata):
    split = annotation_split(adata.obs["cell_type"].astype(str).to_numpy(), seed=1)
    recipe = TrainingRecipe(pretrain_epochs=2, epochs=2)
    first, second = (recipe_run(adata, "cell_type", recipe, split, 1, shape=SHAPE) for _ in range(2))
    assert first[0] == second[0] and np.array_equal(first[1], second[1]) and np.array_equal(first[2], second[2])
