"""Plots. Each function takes ``ax=None``, ``show=None`` and ``return_fig=False`` like scanpy/pertpy."""

from __future__ import annotations

from .dag_comparison import dag_comparison  # paper Fig. 3a/b
from .graph import dag  # the learnt DAG of a run
from .intervention import intervention  # predicted shifts of cape.tl.predict_intervention
from .poincare import generality, poincare  # Step II embedding; paper Fig. 3c

__all__ = ["dag", "dag_comparison", "generality", "intervention", "poincare"]
