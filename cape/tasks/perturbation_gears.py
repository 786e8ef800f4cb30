"""GEARS (Roohani et al. 2023) as a predictor of the perturbation workflow: trained on the training perturbations
of the split it is given, a share of them kept aside to pick its epoch, predicting held-out conditions' mean
expression. The training and prediction are :func:`cape.tasks.gears.train_gears` and
:func:`~cape.tasks.gears.predict_gears`; GEARS itself is the optional extra ``gears`` (cell-gears,
torch_geometric).

GEARS embeds a perturbation through a gene-similarity graph built from Gene Ontology, which it downloads. cape does
not download: the graph is GEARS' own gene2go pickle or a ``source,target,importance`` edge list where the user has
one, else a stand-in built from a gene graph (the Jaccard index of the genes' DAG neighbourhoods, run through
GEARS' own threshold and top-k; :func:`cape.tasks.gears_inputs.dag_gene2go`) — in the workflow, Step I's graph
fitted on the control cells and the training perturbations. With the stand-in it is not the published GEARS.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd

from .._errors import CapeInputError
from .gears import GearsConfig, predict_gears, train_gears
from .gears_inputs import _import_gears
from .perturbation import CONTROL, condition_genes
from .perturbation_predictors import NoChangePredictor

__all__ = ["GearsPerturbationPredictor", "draw_cells", "gears_available"]

logger = logging.getLogger("cape")

#: How to install GEARS, in the messages that need it.
INSTALL = "pip install 'cape-sc[gears]' (cell-gears, torch_geometric)"


def gears_available() -> bool:
    """Whether GEARS and torch_geometric import (the extra ``gears``)."""
    try:
        _import_gears()
    except CapeInputError:
        return False
    return True


class GearsPerturbationPredictor(NoChangePredictor):
    """Predict perturbations with GEARS trained on the training perturbations.

    Parameters
    ----------
    go_graph
        GEARS' perturbation graph: a gene2go ``.pkl`` (e.g. GEARS' ``gene2go_all.pkl``) or ``.csv`` edge list path,
        or an n_genes × n_genes adjacency over the data's genes (``A[i, j] ≠ 0``: i → j) whose DAG neighbourhoods
        stand in for GO. ``None``: ``adata.varp["cape_dag"]`` of the data given to :meth:`fit`.
    epochs
        GEARS' training epochs (its own default is 20; each is a pass over the training and the control cells).
    val_fraction
        Share of the training perturbations kept aside to choose the epoch (at least one), drawn with ``seed``.
    config
        The rest of GEARS' settings (:class:`~cape.tasks.gears.GearsConfig`: width, batch size, learning rate);
        its ``epochs`` is replaced by ``epochs``.
    max_cells
        The most cells GEARS reads (``None``: all): beyond it, each condition (control included) keeps its share of
        ``max_cells``, at least ``min(10, its cells)``, drawn at random with ``seed`` (:func:`draw_cells`). GEARS
        trains on every cell and builds a graph per cell, so its cost on a CPU grows with cells × epochs.
    n_cells
        Control cells each prediction starts from (the same cells for every condition; GEARS' ``predict`` draws
        300 anew per condition), each one forward pass of GEARS.
    seed, device, num_threads
        Seed of the validation draw, GEARS' initialisation, batches and the control cells; ``"cpu"``, ``"cuda"`` or
        ``"auto"``; torch threads while GEARS runs (``None``: leave torch's setting).

    Only the control cells and the training perturbations' cells reach GEARS (:attr:`fitted_cells_`). A held-out
    condition naming a gene outside the GO graph (possible with a real GO file) gets the control mean, with a
    warning (:attr:`outside_graph_` lists them).
    """

    name = "gears"

    def __init__(self, go_graph=None, *, epochs: int = 20, val_fraction: float = 0.1,
                 config: GearsConfig | None = None, max_cells: int | None = None, n_cells: int = 100,
                 seed: int = 0, device: str = "cpu", num_threads: int | None = None) -> None:
        if not 0 < val_fraction < 1:
            raise CapeInputError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
        self.go_graph, self.epochs, self.val_fraction = go_graph, epochs, float(val_fraction)
        self.config = dataclasses.replace(config or GearsConfig(), epochs=epochs)
        self.max_cells, self.n_cells, self.seed = max_cells, n_cells, seed
        self.device, self.num_threads = device, num_threads

    def fit(self, adata: ad.AnnData, train: Sequence[str], *, condition_key: str = "condition",
            control: str = CONTROL) -> GearsPerturbationPredictor:
        super().fit(adata, train, condition_key=condition_key, control=control)
        perts = sorted({str(c) for c in train} - {control})
        if len(perts) < 2:
            raise CapeInputError(f"GEARS needs at least two training perturbations (one to choose its epoch with), "
                                 f"got {len(perts)}")
        n_val = min(len(perts) - 1, max(1, round(self.val_fraction * len(perts))))
        val = sorted(np.random.default_rng(self.seed).choice(perts, n_val, replace=False).tolist())
        go_graph = self.go_graph
        if go_graph is None:
            go_graph = "dag"  # adata.varp["cape_dag"]
        elif not isinstance(go_graph, (str, Path)):
            go_graph = np.asarray(go_graph.toarray() if hasattr(go_graph, "toarray") else go_graph, dtype=float)
            if go_graph.shape != (adata.n_vars, adata.n_vars):
                raise CapeInputError(f"go_graph has shape {go_graph.shape}, expected {adata.n_vars} × "
                                     f"{adata.n_vars} genes")
        labels = adata.obs[condition_key].astype(str).to_numpy()
        cells = draw_cells(labels, [control, *perts], self.max_cells, seed=self.seed)
        self.trained_ = train_gears(adata[cells], [c for c in perts if c not in val], val, self.config,
                                    go_graph=go_graph,
                                    device=self.device, seed=self.seed, condition_key=condition_key,
                                    control=control, num_threads=self.num_threads)
        self.val_ = val
        self.fitted_cells_ = self.trained_["cells"]
        logger.info("GEARS: %d epochs on %d cells of control and %d training perturbations (%d for validation), "
                    "GO graph %s (%.1f s)", self.epochs, len(cells), len(perts) - n_val, n_val,
                    self.trained_["go_graph"].split(" — ")[0], self.trained_["seconds"])
        return self

    def predict(self, conditions: Sequence[str]) -> pd.DataFrame:
        out = super().predict(conditions)
        known = set(map(str, self.trained_["model"].pert_list))
        inside = [c for c in out.index if all(g in known for g in condition_genes(c))]
        self.outside_graph_ = [c for c in out.index if c not in inside]
        if self.outside_graph_:
            logger.warning("GEARS: %d condition(s) name genes outside its GO graph and get the control mean: %s",
                           len(self.outside_graph_), ", ".join(self.outside_graph_[:5]))
        if inside:
            predicted = predict_gears(self.trained_, inside, n_cells=self.n_cells, seed=self.seed,
                                      num_threads=self.num_threads)
            out.loc[inside] = predicted.loc[inside, out.columns].to_numpy()
        return out



def draw_cells(labels: np.ndarray, conditions: Sequence[str], max_cells: int | None, *, seed: int = 0,
               min_cells: int = 10) -> np.ndarray:
    """Positions of the cells of ``conditions`` (in data order), at most about ``max_cells`` of them: when there are
    more, each condition keeps ``round(max_cells × its share)`` cells, at least ``min(min_cells, its cells)``,
    drawn at random with ``seed``. ``None`` keeps them all."""
    labels = np.asarray(labels).astype(str)
    positions = np.flatnonzero(np.isin(labels, list(conditions)))
    if max_cells is None or positions.size <= max_cells:
        return positions
    rng = np.random.default_rng(seed)
    fraction = max_cells / positions.size
    kept = []
    for condition in dict.fromkeys(conditions):
        own = np.flatnonzero(labels == condition)
        n = min(own.size, max(min_cells, round(fraction * own.size)))
        kept.append(rng.choice(own, n, replace=False))
    return np.sort(np.concatenate(kept))
