"""cape.pl.perturbation_shifts: one panel per condition with its DE genes' predicted and observed shifts, one colour
per predictor, the file written; bad input refused."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

import cape
from cape import CapeInputError
from cape._io import save_figure

matplotlib.use("Agg")

GENES = [f"G{i}" for i in range(8)]
CONDITIONS = ["G0+ctrl", "G1+ctrl", "G0+G1", "G2+G3", "G4+ctrl"]


def _tables():
    rng = np.random.default_rng(0)
    control = pd.Series(rng.uniform(1, 2, len(GENES)), index=GENES)
    observed = pd.DataFrame(control.to_numpy() + rng.normal(size=(len(CONDITIONS), len(GENES))), index=CONDITIONS,
                            columns=GENES)
    observed.loc["G4+ctrl"] = control + 0.01  # the smallest effect: never drawn by default
    de = {c: GENES[:5] for c in CONDITIONS}
    return control, observed, de


def test_panels_points_and_colours_per_predictor(tmp_path):
    control, observed, de = _tables()
    shifted = observed + 0.1
    fig = cape.pl.perturbation_shifts({"exact": observed, "shifted": shifted, "no change": observed * 0 + control},
                                      observed, control, de, n_conditions=4, return_fig=True, title="t")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    drawn = [ax.get_title().split(" ")[0] for ax in panels]
    assert sorted(drawn) == sorted(CONDITIONS[:4])  # G4+ctrl, the smallest effect, left out
    assert ["ctrl" in c for c in drawn] == [True, False, True, False]  # singles and doubles in turn
    first = panels[0]
    cond = first.get_title().split(" ")[0]
    exact = first.collections[0].get_offsets()  # x observed shift, y predicted shift, one point a DE gene
    assert len(exact) == 5
    np.testing.assert_allclose(exact[:, 0], exact[:, 1])
    flat = next(c for c in first.collections if c.get_label() == "no change").get_offsets()
    np.testing.assert_allclose(flat[:, 1], 0, atol=1e-12)
    np.testing.assert_allclose(flat[:, 0], observed.loc[cond, GENES[:5]] - control[GENES[:5]])
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["exact", "shifted", "no change", "perturbed gene"]
    assert fig._suptitle.get_text() == "t"
    path = save_figure(fig, tmp_path / "shifts.png")
    assert path.stat().st_size > 0
    plt.close(fig)


def test_default_choice_mixes_singles_and_doubles_and_given_axes_are_used():
    control, observed, de = _tables()
    fig = cape.pl.perturbation_shifts(observed, observed, control, de, n_conditions=2, return_fig=True)
    drawn = [ax.get_title().split(" ")[0] for ax in fig.axes if ax.get_visible()]
    assert len(drawn) == 2 and sorted(len(c.split("+")) - c.count("ctrl") for c in drawn) == [1, 2]
    plt.close(fig)
    fig, axes = plt.subplots(1, 2)
    out = cape.pl.perturbation_shifts(observed, observed, control, de, conditions=["G2+G3", "G4+ctrl"], ax=axes,
                                      return_fig=True)
    assert out is fig and [ax.get_title().split(" ")[0] for ax in axes] == ["G2+G3", "G4+ctrl"]
    plt.close(fig)


def test_bad_input_is_refused():
    control, observed, de = _tables()
    with pytest.raises(CapeInputError, match="no prediction for condition 'G2\\+G3'"):
        cape.pl.perturbation_shifts({"p": observed.iloc[:2]}, observed, control, de, conditions=["G2+G3"])
    with pytest.raises(CapeInputError, match="no column for DE gene 'G0'"):
        cape.pl.perturbation_shifts(observed.drop(columns="G0"), observed, control, de, return_fig=True)
    _, ax = plt.subplots()
    with pytest.raises(CapeInputError, match="2 conditions to draw but 1 Axes"):
        cape.pl.perturbation_shifts(observed, observed, control, de, n_conditions=2, ax=ax)
    plt.close("all")
