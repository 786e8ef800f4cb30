from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cape.report.statistics import (
    accuracy,
    adjusted_rand,
    bootstrap_difference,
)


# ------------------------------------------------------------------------------------------------- bootstrap
def test_bootstrap_difference_of_accuracy():
    y = np.array(["a"] * 50 + ["b"] * 50)
    a = y.copy()
    b = y.copy()
    b[:20] = "b"  # 20 mistakes
    diff, low, high = bootstrap_difference(y, a, b, accuracy, seed=0)
    assert diff == pytest.approx(0.2)
    assert 0 < low < diff < high < 0.4
    assert bootstrap_difference(y, a, b, accuracy, seed=0) == (diff, low, high)
    assert bootstrap_difference(y, a, a, accuracy) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="equally long"):
        bootstrap_difference(y, a[:3], b, accuracy)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from("abc")), min_size=1, max_size=40))
def test_adjusted_rand_matches_sklearn(pairs):
    from sklearn.metrics import adjusted_rand_score

    clusters, labels = map(np.array, zip(*pairs, strict=True))
    assert adjusted_rand(labels, clusters) == pytest.approx(adjusted_rand_score(labels, clusters), abs=1e-12)
