"""BEELINE's early precision ratio: limits, ties and the chance level."""

from __future__ import annotations

import numpy as np
import pytest

from cape.causal.structure_recovery import dag_metrics, early_precision_ratio


def _chain(m: int) -> np.ndarray:
    T = np.zeros((m, m))
    T[np.arange(m - 1), np.arange(1, m)] = 1.0
    return T


def test_perfect_ranking_reaches_the_inverse_density_and_reversed_gets_zero() -> None:
    T = _chain(6)  # 5 true edges among 30 ordered pairs
    assert early_precision_ratio(T, 0.5 * T) == pytest.approx(30 / 5)
    assert early_precision_ratio(T, T.T) == 0.0
    assert dag_metrics(T, T)["epr"] == pytest.approx(6.0)


def test_ties_at_the_cut_all_count_and_zero_scores_never() -> None:
    T = _chain(4)  # 3 true edges among 12 pairs: density 1/4
    S = np.zeros((4, 4))
    S[0, 1] = 2.0  # a hit ranked first
    S[1, 0] = S[2, 1] = S[3, 0] = 1.0  # three misses tied at the 2nd place: all four pairs are chosen
    assert early_precision_ratio(T, S) == pytest.approx((1 / 4) / (3 / 12))
    only_one = np.zeros((4, 4))
    only_one[1, 2] = 0.3  # fewer nonzero scores than true edges: precision over what was scored
    assert early_precision_ratio(T, only_one) == pytest.approx(1 / (3 / 12))
    assert early_precision_ratio(T, np.zeros((4, 4))) == 0.0
    assert np.isnan(early_precision_ratio(np.zeros((4, 4)), S))


def test_matches_brute_force_and_random_rankings_sit_at_chance() -> None:
    rng = np.random.default_rng(0)
    m = 12
    ratios = []
    for _ in range(300):
        T = np.triu(rng.random((m, m)) < 0.15, 1).astype(float)
        if not T.any():
            continue
        S = rng.random((m, m))
        off = ~np.eye(m, dtype=bool)
        k = int(T[off].sum())
        order = np.argsort(-S[off], kind="stable")[:k]  # no ties with continuous scores
        brute = T[off][order].mean() / (k / off.sum())
        value = early_precision_ratio(T, -S)  # the sign is ignored
        assert value == pytest.approx(brute)
        ratios.append(value)
    assert abs(np.mean(ratios) - 1.0) < 0.15
    with pytest.raises(ValueError, match="square"):
        early_precision_ratio(np.zeros((3, 3)), np.zeros((3, 4)))
