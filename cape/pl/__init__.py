"""Plots. Each function takes ``ax=None``, ``show=None`` and ``return_fig=False`` like scanpy/pertpy, and ``save=None``:
a file to write the figure to, its format from the suffix (scanpy's ``save`` is a suffix for a default name instead)."""

from __future__ import annotations

from ._dag_comparison import dag_comparison  # paper Fig. 3a/b
from ._graph import dag  # the learnt DAG of a run
from ._intervention import intervention  # predicted shifts of cape.tl.predict_intervention
from ._perturbation_shifts import perturbation_shifts  # predicted against observed, held-out perturbations
from ._poincare_disk import generality, poincare  # Step II embedding; paper Fig. 3c

__all__ = ["dag", "dag_comparison", "generality", "intervention", "perturbation_shifts", "poincare"]
