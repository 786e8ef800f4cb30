"""The newcomer's matrix (issue 55) and the schedules its timing compares."""

from __future__ import annotations

import numpy as np

from cape_benchmarks.newcomer import SCHEDULES, newcomer_matrix


def test_newcomer_matrix_has_raw_counts_marker_blocks_and_a_hub():
    adata = newcomer_matrix(n_cells=400, n_genes=300, seed=1)
    counts = adata.X.toarray()
    assert adata.shape == (400, 300) and np.array_equal(counts, np.round(counts)) and counts.min() >= 0
    types = adata.obs["cell_type"].astype(str).to_numpy()
    markers = counts[:, 100:150].mean(1)                          # type0's 50 markers, 6-fold in its cells
    assert markers[types == "type0"].mean() > 3 * markers[types != "type0"].mean()
    assert np.corrcoef(np.log1p(counts[:, 0]), np.log1p(counts[:, 1:11]).mean(1))[0, 1] > 0.2   # gene 0 drives 1–10


def test_the_long_schedule_is_the_former_default():
    assert SCHEDULES["long_schedule"]["pretrain"] == {"epochs": 40}
    assert SCHEDULES["long_schedule"]["train"] == {"early_stopping_ceiling_patience": None}


def test_structure_curve_scores_the_cls_state_after_every_pretraining_epoch():
    from cape.models.training import engine
    from cape_benchmarks.cli.pretrain_structure import structure_curve

    adata = newcomer_matrix(n_cells=60, n_genes=300, seed=2)
    adata.X = adata.X.log1p()
    epoch_of = engine.Trainer._epoch
    history = structure_curve(adata, "cell_type", seed=0, epochs=2)
    assert [r["epoch"] for r in history] == [1, 2] and all(-1 <= r["ari"] <= 1 for r in history)
    assert engine.Trainer._epoch is epoch_of                       # the scoring hook is removed afterwards
