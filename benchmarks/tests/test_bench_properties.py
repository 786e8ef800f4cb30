"""Paper Sec. 4 properties (Props 4.1–4.3) as numerical checks, and the Step II plots."""

from __future__ import annotations

import math

import anndata as ad
import matplotlib
import numpy as np
import pytest
import torch

from cape.hyperbolic import poincare_distance
from cape_benchmarks.properties import (
    angle_sigma,
    attention_score,
    bound_surface,
    euclidean_gap,
    expected_bias,
    hoeffding_bound,
    noise_bias,
    pair_at,
    upper_bound,
)

matplotlib.use("Agg")


def qk(seed: int, d_model: int = 128):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(d_model, generator=gen, dtype=torch.float64),
            torch.randn(d_model, generator=gen, dtype=torch.float64), gen)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_score_lies_between_the_bounds(seed):
    q, k, gen = qk(seed)
    e = torch.randn(500, 2, 64, generator=gen, dtype=torch.float64)
    e = e / e.norm(dim=-1, keepdim=True) * torch.rand(500, 2, 1, generator=gen, dtype=torch.float64)
    score = attention_score(q, k, e[:, 0], e[:, 1])
    bound = upper_bound(q, k, (e[:, 0] - e[:, 1]).norm(dim=-1))
    assert torch.all(score <= bound) and torch.all(score >= -bound)


def test_score_matches_relative_rotation_formula():
    # qᵀR(θ)k = Σ_t α_t cos θ_t + β_t sin θ_t with θ = φ_n − φ_m under Eq. 26's R. (Eq. A.56 writes the
    # argument as φ_m − φ_n, which flips the sign of the β terms only; the bounds use |β|.)
    q, k, gen = qk(5, 8)
    e_m, e_n = torch.rand(2, 4, generator=gen, dtype=torch.float64) * 0.5
    dphi = math.pi / 4 * (e_n - e_m)
    alpha = q[0::2] * k[0::2] + q[1::2] * k[1::2]
    beta = q[1::2] * k[0::2] - q[0::2] * k[1::2]
    expected = (alpha * torch.cos(dphi) + beta * torch.sin(dphi)).sum()
    torch.testing.assert_close(attention_score(q, k, e_m, e_n), expected)


def test_pair_construction_hits_the_requested_poincare_distance():
    gen = torch.Generator().manual_seed(0)
    u, v = torch.linalg.qr(torch.randn(64, 2, generator=gen, dtype=torch.float64))[0].T
    for dp, r in [(1.0, 0.5), (2.5, 0.8), (5.0, 0.97)]:
        gap = float(euclidean_gap(np.array(dp), r, r))
        e_m, e_n = pair_at(r, gap, u, v)
        assert float(e_m.norm()) == pytest.approx(r) and float(e_n.norm()) == pytest.approx(r)
        assert float(poincare_distance(e_m, e_n)) == pytest.approx(dp, rel=1e-9)


@pytest.mark.parametrize("seed", [0, 3])
def test_upper_bound_attenuates_with_distance_and_generality(seed):
    q, k, _ = qk(seed)
    distances = np.linspace(1.0, 5.0, 40)
    radii = np.linspace(0.02, 0.98, 40)
    surface = bound_surface(q, k, distances, radii)
    assert np.isfinite(surface).sum() > 400
    tol = 1e-12 * np.nanmax(surface)
    assert not np.any(np.diff(surface, axis=1) > tol)  # Prop 4.1: non-increasing in d_p at fixed r
    assert not np.any(-np.diff(surface, axis=0) > tol)  # Prop 4.2: non-increasing in ψ = 1 − r at fixed d_p
    # and strictly somewhere (the property is not vacuous)
    assert np.nanmin(np.diff(surface, axis=1)) < -tol


def test_upper_bound_limit_as_generality_goes_to_one():
    # Corollary A.2: with d_p fixed and e_m → 0, ‖e_n‖ → tanh(d_p/2) = √(C/(C+1)) and A⁺ → a, a decreasing in d_p.
    q, k, _ = qk(7)
    limits = []
    for dp in (0.5, 1.0, 2.0, 4.0):
        c = (math.cosh(dp) - 1) / 2
        assert math.tanh(dp / 2) == pytest.approx(math.sqrt(c / (c + 1)))
        a = float(upper_bound(q, k, math.sqrt(c / (c + 1))))
        approach = [float(upper_bound(q, k, float(euclidean_gap(np.array(dp), r_m, math.tanh(dp / 2)))))
                    for r_m in (1e-2, 1e-4, 1e-6)]
        assert abs(approach[-1] - a) < abs(approach[0] - a) + 1e-12
        assert approach[-1] == pytest.approx(a, rel=1e-12)
        limits.append(a)
    assert np.all(np.diff(limits) < 0)


def test_noise_bias_concentrates_and_centres_on_expected_value():
    q, k, gen = qk(11)
    e = torch.randn(2, 64, generator=gen, dtype=torch.float64)
    e = e / e.norm(dim=-1, keepdim=True) * 0.6
    for sigma in (0.1, 0.3):
        xi1 = noise_bias(q, k, e[0], e[1], sigma, 1, 200, gen)
        xi100 = noise_bias(q, k, e[0], e[1], sigma, 100, 200, gen)
        assert float(xi100.std()) < 0.2 * float(xi1.std())  # 1/√N shrinkage (0.1 expected)
        expected = expected_bias(q, k, e[0], e[1], sigma)
        stderr = float(xi100.std()) / math.sqrt(200)
        assert abs(float(xi100.mean()) - expected) < 5 * stderr
    assert expected_bias(q, k, e[0], e[1], 0.0) == 0.0


@pytest.mark.parametrize("noise_on", ["embedding", "angle"])
def test_noise_bias_limit_is_the_papers_expectation_not_zero(noise_on):
    # Prop A.10 / Eq. A.101: ξ_N → E ξ_N = (exp(−s²) − 1)·A in probability, s = cσ (noise on e) or σ (on φ).
    # The centred ξ_N − E ξ_N goes to 0; ξ_N itself goes to 0 only as σ → 0 (Eq. A.104).
    q, k, gen = qk(13)
    e = torch.randn(2, 64, generator=gen, dtype=torch.float64)
    e = e / e.norm(dim=-1, keepdim=True) * 0.5
    clean = float(attention_score(q, k, e[0], e[1]))
    sigma = 0.3
    s = angle_sigma(sigma, noise_on)
    assert s == pytest.approx(math.pi / 4 * sigma if noise_on == "embedding" else sigma)
    expected = expected_bias(q, k, e[0], e[1], sigma, noise_on)
    assert expected == pytest.approx((math.exp(-(s**2)) - 1.0) * clean, rel=1e-12)
    xi = noise_bias(q, k, e[0], e[1], sigma, 4000, 20, gen, noise_on)
    stderr = float(xi.std()) / math.sqrt(20)
    assert abs(float(xi.mean()) - expected) < 5 * stderr
    assert abs(expected) > 10 * stderr  # the limit is measurably not 0 at σ = 0.3
    # spread of the centred bias shrinks like 1/√N: 16× more pairs, 4× smaller spread
    sd4 = float(noise_bias(q, k, e[0], e[1], sigma, 4, 400, gen, noise_on).std())
    sd64 = float(noise_bias(q, k, e[0], e[1], sigma, 64, 400, gen, noise_on).std())
    assert 3.0 < sd4 / sd64 < 5.3
    # Eq. A.104: the relative centre vanishes as σ → 0
    ratios = [abs(expected_bias(q, k, e[0], e[1], sig, noise_on) / clean) for sig in (0.3, 0.1, 0.01, 0.0)]
    assert np.all(np.diff(ratios) < 0) and ratios[-1] == 0.0


def test_hoeffding_bound_holds_for_the_centred_bias():
    q, k, gen = qk(17)
    e = torch.randn(2, 64, generator=gen, dtype=torch.float64) * 0.05
    sigma, eps = 0.3, 1.0
    for n in (1, 10, 100):
        xi = noise_bias(q, k, e[0], e[1], sigma, n, 200, gen)
        tail = float((torch.abs(xi - expected_bias(q, k, e[0], e[1], sigma)) >= eps).double().mean())
        assert tail <= hoeffding_bound(q, k, eps, n)
    assert hoeffding_bound(q, k, 1e4, 100) < 1e-3  # not vacuous for large ε
    with pytest.raises(ValueError, match="noise_on"):
        angle_sigma(0.1, "gene")


def small_embedded(dim: int) -> ad.AnnData:
    import cape
    from cape_benchmarks.embedding import barabasi_albert_dag

    adata = ad.AnnData(np.ones((3, 12), dtype=np.float32))
    adata.var_names = [f"g{i}" for i in range(12)]
    adata.varp["cape_dag"] = barabasi_albert_dag(12, 2, seed=0)
    adata.var["kind"] = ["a", "b"] * 6
    cape.tl.hyperbolic_embedding(adata, dim=dim, epochs=20)
    return adata


@pytest.mark.parametrize(("dim", "color"), [(2, "cape_generality"), (3, "kind"), (5, None)])
def test_poincare_plot(dim, color):
    import matplotlib.pyplot as plt

    import cape

    adata = small_embedded(dim)
    fig = cape.pl.poincare(adata, color=color, return_fig=True)
    assert fig is not None
    ax = fig.axes[0]
    assert ax.name != "3d"  # a disk whatever the dimension: radius the norm, angle from the direction
    edges = [c for c in ax.collections if type(c).__name__ == "LineCollection"]
    assert len(edges[0].get_segments()) == adata.varp["cape_dag"].nnz
    plt.close(fig)
    fig = cape.pl.generality(adata, return_fig=True)
    assert "Spearman" in fig.axes[0].get_title()
    plt.close(fig)


def test_plot_errors_name_the_missing_key():
    import cape
    from cape import CapeInputError

    adata = ad.AnnData(np.ones((2, 3), dtype=np.float32))
    with pytest.raises(CapeInputError, match="cape embed"):
        cape.pl.poincare(adata)
    adata = small_embedded(2)
    with pytest.raises(CapeInputError, match="not a column"):
        cape.pl.poincare(adata, color="nope")
    with pytest.raises(CapeInputError, match="components"):
        cape.pl.poincare(adata, components=[0, 5])


# -- Step III maps (issue 33): Props 4.1/4.2 hold on the low band of a multi-band map ------------------------------

def test_single_band_map_reproduces_fig_s2():
    from cape_benchmarks.properties import fig_s2, map_properties

    s2 = {r["metric"]: r["value"] for r in fig_s2(0, n_grid=12)[0]}
    one = {r["metric"]: r["value"] for r in map_properties(0, bands=1, n_grid=12, n_pairs=300, n_genes=50)}
    assert one["Prop 4.1 on the low band: monotonicity violations of A⁺ (d_p)"] == s2["monotonicity violations (d_p)"]
    assert one["Prop 4.2 on the low band: monotonicity violations of A⁺ (ψ)"] == s2["monotonicity violations (ψ)"]
    assert one["pairs with abs Δφ ≤ π/2 in every plane (the bound's premise)"] == 1.0


@pytest.mark.parametrize("bands", [2, 4])
def test_multi_band_map_keeps_props_on_its_low_band_and_separates_genes(bands):
    from cape_benchmarks.properties import map_properties

    multi = {r["metric"]: r["value"] for r in map_properties(1, bands=bands, n_grid=12, n_pairs=300, n_genes=80)}
    one = {r["metric"]: r["value"] for r in map_properties(1, bands=1, n_grid=12, n_pairs=300, n_genes=80)}
    assert multi["Prop 4.1 on the low band: monotonicity violations of A⁺ (d_p)"] == 0
    assert multi["Prop 4.2 on the low band: monotonicity violations of A⁺ (ψ)"] == 0
    assert multi["A⁻ ≤ A ≤ A⁺ on the low band, share of 300 random pairs"] == 1.0
    assert multi["max abs φ in band 0 (ω = 1)"] < math.pi / 4
    assert multi[f"max abs φ in band {bands - 1} (ω = 64)"] > math.pi  # the top band wraps around
    assert multi["pairs with abs Δφ ≤ π/2 in every plane (the bound's premise)"] < 0.5
    nn = "median nearest-neighbour rotation distance, 80 genes on the shell ‖e‖ ∈ [0.91, 0.99] (rad)"
    assert multi[nn] > 3 * one[nn]
    decay = "Spearman(A, d_p) with k = q, whole map, 300 random pairs"
    assert one[decay] < -0.8 and multi[decay] > one[decay]  # the whole map decays less with distance


def test_map_properties_refuses_bands_that_do_not_split_the_planes():
    from cape_benchmarks.properties import map_properties

    with pytest.raises(ValueError, match="3 bands"):
        map_properties(0, bands=3)
