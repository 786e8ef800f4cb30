"""Plots. Each function takes ``ax=None``, ``show=None`` and ``return_fig=False`` like scanpy/pertpy."""

from __future__ import annotations

from .dag_comparison import dag_comparison  # noqa: F401  (paper Fig. 3a/b)
from .graph import dag  # noqa: F401  (the learnt DAG of a run)
from .intervention import intervention  # noqa: F401  (predicted shifts of cape.tl.predict_intervention)
from .poincare import generality, poincare  # noqa: F401  (Step II embedding; paper Fig. 3c)
