"""Paired differences over seeds: the interval is Student's, the verdict reads its side, the MDD is the power
formula, and the table pairs by seed within backbone and integration."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from cape_benchmarks import paired


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 15), st.integers(0, 2**32 - 1), st.floats(-1.0, 1.0))
def test_interval_is_scipys_paired_t_interval(n, seed, shift):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=n)
    b = a - shift + rng.normal(scale=0.3, size=n)
    mean, low, high = paired.paired_interval(a - b)
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert mean == pytest.approx(np.mean(a - b))
    assert (low, high) == pytest.approx((ci.low, ci.high), abs=1e-9)


def test_interval_needs_two_pairs():
    mean, low, high = paired.paired_interval([0.3])
    assert mean == 0.3 and np.isnan(low) and np.isnan(high)
    assert all(np.isnan(paired.paired_interval([])))


@pytest.mark.parametrize("low, high, lower_is_better, expected", [
    (0.01, 0.2, False, "better"), (-0.2, -0.01, False, "worse"), (-0.1, 0.1, False, "no detectable difference"),
    (0.01, 0.2, True, "worse"), (-0.2, -0.01, True, "better"), (np.nan, np.nan, False, "no detectable difference")])
def test_verdict_reads_the_side_of_zero(low, high, lower_is_better, expected):
    assert paired.verdict(low, high, lower_is_better) == expected


@settings(max_examples=30, deadline=None)
@given(st.floats(0.001, 1.0), st.integers(2, 40))
def test_mdd_is_the_power_formula_and_shrinks_with_seeds(sd, n):
    df = n - 1
    expected = (stats.t.ppf(0.975, df) + stats.t.ppf(0.8, df)) * sd / np.sqrt(n)
    assert paired.minimum_detectable_difference(sd, n) == pytest.approx(expected)
    assert paired.minimum_detectable_difference(sd, n + 1) < paired.minimum_detectable_difference(sd, n)
    assert np.isnan(paired.minimum_detectable_difference(sd, 1))


def test_mdd_is_detected_about_80_percent_of_the_time():
    # A true difference equal to the MDD is found (interval excludes 0) in about 80 % of simulated designs.
    rng = np.random.default_rng(0)
    n, sd = 10, 0.03
    mdd = paired.minimum_detectable_difference(sd, n)
    hits = sum(paired.paired_interval(rng.normal(mdd, sd, size=n))[1] > 0 for _ in range(4000)) / 4000
    assert 0.75 < hits < 0.85


def _records(values: dict[tuple[str, str, str], list[float]], metric: str = "accuracy") -> list[dict]:
    return [{"kind": "model", "backbone": b, "integration": i, "encoding": e, "seed": s, "metric": metric,
             "value": v} for (b, i, e), vs in values.items() for s, v in enumerate(vs)]


def test_pairs_by_seed_within_backbone_and_integration():
    rng = np.random.default_rng(1)
    base = rng.uniform(0.5, 0.9, size=10)  # large seed-to-seed spread, shared by both rows
    recs = _records({("scgpt", "complement", "trainable_absolute"): list(base),
                     ("scgpt", "complement", "cape"): list(base + 0.02 + rng.normal(0, 0.002, 10)),
                     ("scgpt", "replace", "trainable_absolute"): list(base),
                     ("scgpt", "replace", "cape"): list(base - 0.02)})
    frame = paired.paired_differences(recs, {"default": {"scgpt": "trainable_absolute"}}, ["accuracy"])
    comp = frame[(frame.integration == "complement") & (frame.encoding == "cape")].iloc[0]
    rep = frame[(frame.integration == "replace") & (frame.encoding == "cape")].iloc[0]
    assert comp["n"] == 10 and comp["difference"] == pytest.approx(0.02, abs=0.002)
    assert comp["verdict"] == "better"  # unpaired, the 0.1 spread of base would hide a 0.02 gain
    assert rep["verdict"] == "worse" and rep["difference"] == pytest.approx(-0.02)
    assert len(frame) == 2  # the default is not compared with itself


def test_lower_is_better_and_missing_seeds():
    recs = _records({("scbert", "complement", "static_absolute"): [0.30, 0.32, 0.31],
                     ("scbert", "complement", "cape"): [0.20, 0.21]}, metric="mse_overall")
    frame = paired.paired_differences(recs, {"default": {"scbert": "static_absolute"}}, ["mse_overall"],
                                      lower_is_better={"mse_overall"})
    row = frame.iloc[0]
    assert row["n"] == 2 and row["verdict"] == "better"
    table = paired.paired_table(frame)
    assert "| scbert (complement) | cape | mse_overall | 2 | -0.105 [" in table and "| better |" in table
