"""``cape-bench perturbation-dag``: the quick run's records and outputs, the paired summaries, the members' data."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from cape import CapeInputError
from cape_benchmarks import perturbation_dag as bench
from cape_benchmarks.cli import main


def _record(seed: int, condition: str, predictor: str, value: float, subgroup: str = "unseen_single") -> dict:
    return {"member": "m", "seed": seed, "kind": "score", "predictor": predictor, "condition": condition,
            "subgroup": subgroup, "metric": "top_de_mse", "value": value}


def test_paired_comparisons_pair_each_perturbation_with_itself_and_count_the_seeds() -> None:
    rng = np.random.default_rng(0)
    records = []
    for seed in range(3):
        for k in range(8):
            base = rng.uniform(1.0, 2.0)  # a perturbation's difficulty, shared by both predictors
            records += [_record(seed, f"g{k}+ctrl", "linear", base),
                        _record(seed, f"g{k}+ctrl", "scm_interventional", base - 0.1 - 0.01 * seed)]
    records.append(_record(0, "g99+ctrl", "linear", 5.0))  # no partner: left out of the pairs
    paired = bench.paired_comparisons(records, comparisons=(("scm_interventional", "linear"),),
                                      metrics=("top_de_mse",))
    row = paired[paired["subgroup"] == "unseen_single"].iloc[0]
    assert row["n"] == 24 and row["seeds"] == 3 and row["seeds_better"] == 3
    np.testing.assert_allclose(row["difference"], -0.11)
    np.testing.assert_allclose(row["seed_difference"], -0.11)
    assert row["low"] <= row["difference"] <= row["high"] and row["high"] < 0
    assert row["seed_low"] <= row["seed_difference"] <= row["seed_high"] < 0
    assert set(paired["subgroup"]) == {"unseen_single", "all"}


def test_the_quick_run_writes_records_tables_and_a_figure(tmp_path) -> None:
    records = bench.run_perturbation_dag(tmp_path, quick=True, members=["grn50", "bn_ecoli70"], seeds=2,
                                         cell_eval=False)
    assert json.loads((tmp_path / "perturbation_dag.json").read_text()) == json.loads(json.dumps(records))
    assert (tmp_path / "perturbation_dag.png").stat().st_size > 0
    frame = pd.DataFrame([r for r in records if r["kind"] == "score"])
    assert set(frame["member"]) == {"grn50", "bn_ecoli70"} and set(frame["seed"]) == {0, 1}
    assert {"no_change", "train_mean", "additive", "linear", "scm_control", "scm_interventional"} \
        <= set(frame["predictor"])
    assert "transformer" not in set(frame["predictor"])
    assert {"top_de_mse", "pearson_delta", "top_de_mse_downstream", "pearson_delta_downstream"} <= set(frame["metric"])
    runs = {r["member"]: r["target_value"] for r in records if r["kind"] == "run"}
    assert runs == {"grn50": "zero", "bn_ecoli70": "training"}
    grn_subgroups = set(frame[frame["member"] == "grn50"]["subgroup"])
    assert set(frame[frame["member"] == "bn_ecoli70"]["subgroup"]) == {"unseen_single"}
    assert grn_subgroups & {"combo_seen0", "combo_seen1", "combo_seen2"}
    paired = bench.paired_comparisons(records)
    assert len(paired) and (paired["low"] <= paired["difference"]).all() \
        and (paired["difference"] <= paired["high"]).all()
    mse = frame[(frame["member"] == "grn50") & (frame["metric"] == "top_de_mse")]
    wide = mse.pivot_table(index=["seed", "condition"], columns="predictor", values="value")
    row = paired[(paired["member"] == "grn50") & (paired["metric"] == "top_de_mse") & (paired["subgroup"] == "all")
                 & (paired["b"] == "linear")].iloc[0]
    np.testing.assert_allclose(row["difference"], (wide["scm_interventional"] - wide["linear"]).mean())
    text = (tmp_path / "perturbation_dag.md").read_text()
    assert "## grn50" in text and "## bn_ecoli70" in text and "cell-eval's scores are off" in text
    assert "scm_interventional − scm_control" in text


def test_the_knockdown_member_is_non_negative_and_knocks_down_every_gene_with_descendants() -> None:
    adata = bench.member_data("bn_ecoli70", bench.QUICK_MEMBERS["bn_ecoli70"], seed=0)
    X = np.asarray(adata.X)
    assert X.min() == 0.0 and np.allclose(X.min(axis=0), 0.0)
    conditions = set(adata.obs["condition"].astype(str)) - {"ctrl"}
    assert len(conditions) == 22 and all(c.endswith("+ctrl") for c in conditions)


def test_unknown_members_are_refused_in_one_line(tmp_path) -> None:
    with pytest.raises(CapeInputError, match="unknown member"):
        bench.run_perturbation_dag(tmp_path, quick=True, members=["nope"])
    with pytest.raises(SystemExit):
        main(["perturbation-dag", "--members", "nope"])
