"""The structural-equation predictor of the perturbation benchmark: perturbations as do(x = value) (0 for a
knock-out) in a causal model fitted on the control cells alone, or on the control cells and the training
perturbations as interventions (Step I's learned SEM, or a DAG refit by least squares)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

from .._arrays import dense
from .._errors import CapeInputError
from ..causal import (
    CausalConfig,
    fit_variational_notears,
    intervene,
    learn_causal_graph,
    learned_equations,
    linear_equations,
    make_dag,
)
from ..causal.postprocess import choose_tau
from .perturbation import CONTROL, condition_genes
from .perturbation_predictors import NoChangePredictor

__all__ = ["SCMPerturbationPredictor"]

logger = logging.getLogger("cape")


class SCMPerturbationPredictor(NoChangePredictor):
    """Predict a perturbation as do(x_g = value) for its genes, propagated through structural equations.

    Parameters
    ----------
    graph
        ``None``: learn the DAG with Step I (:func:`cape.causal.fit_variational_notears` on the control cells,
        ``rank`` as :func:`cape.tl.causal_graph` uses it, threshold by its automatic rule); or an n_genes ×
        n_genes adjacency (A[i, j] ≠ 0: i → j), e.g. the true DAG of a simulation (an oracle).
    equations
        ``"learned"`` (Step I's encoder, feature-space SEM and decoder; needs ``graph=None``) or ``"linear"``
        (each gene refit on its graph parents by least squares on the control cells).
    value
        What the perturbed genes are set to: a number (0, the default: a knock-out, do(x = 0)), or
        ``"training"``: each gene to its mean level in the cells of the training perturbations that target it,
        and a gene no training perturbation targets to its control mean plus the median of the training targets'
        shifts (level − control mean, in the data's units: a log fold change on log-normalised data). For
        knock-downs (CRISPRi) and activations (CRISPRa), where the target keeps or gains expression.
    rank, epochs, seed
        Step I settings (``graph=None`` only).
    config
        ``None`` (default): Step I is :func:`cape.causal.fit_variational_notears` with ``rank`` and ``epochs``,
        thresholded by the automatic rule. A :class:`~cape.causal.CausalConfig`: Step I's whole pipeline
        (:func:`cape.causal.learn_causal_graph`: screen, fit, edge budget, cycle breaking and, with
        ``interventions``, orientation by the perturbations' shifts), as ``cape causal`` runs it (``rank`` and
        ``epochs`` are then the config's).
    max_cells
        The most cells Step I reads (``None``: all): beyond it, that many are drawn at random with ``seed`` from the
        cells it may read (its cost grows with cells × epochs). The counterfactuals still start from every control
        cell.
    interventions
        ``False`` (default): Step I sees the control cells only. ``True``: Step I is fitted on the control cells
        and the cells of the training perturbations, each cell's perturbed genes passed as its intervention mask
        (``intervened=`` of :func:`cape.causal.fit_variational_notears`: a knocked-out gene's own equation is left
        out of that cell's loss, its value still drives its children). Cells of conditions not in ``train`` never
        reach the fit (:attr:`fitted_cells_` lists the cells it read). Needs ``graph=None``.

    The prediction for a condition is the mean over the control cells of their counterfactuals (each cell
    keeps its abducted noise). The learned equations' standardisation comes from the cells Step I read; a linear
    refit (``equations="linear"``) reads the control cells only, where every gene's own equation holds.
    """

    name = "scm"

    def __init__(self, graph=None, *, equations: str = "learned", value: float | str = 0.0, rank: int | None = 40,
                 epochs: int = 100, seed: int = 0, interventions: bool = False,
                 config: CausalConfig | None = None, max_cells: int | None = None) -> None:
        if equations not in ("learned", "linear"):
            raise CapeInputError(f"equations must be 'learned' or 'linear', got {equations!r}")
        if equations == "learned" and graph is not None:
            raise CapeInputError("learned equations come from Step I's own fit: pass graph=None, or equations='linear'")
        if interventions and graph is not None:
            raise CapeInputError("interventions=True fits Step I on the training perturbations: pass graph=None")
        if isinstance(value, str) and value != "training":
            raise CapeInputError(f"value must be a number or 'training', got {value!r}")
        self.graph, self.equations = graph, equations
        self.value = value if isinstance(value, str) else float(value)
        self.rank, self.epochs, self.seed, self.interventions = rank, epochs, seed, bool(interventions)
        self.config, self.max_cells = config, max_cells
        if self.interventions:
            self.name = "scm_interventional"

    def fit(self, adata: ad.AnnData, train: Sequence[str], *, condition_key: str = "condition",
            control: str = CONTROL) -> SCMPerturbationPredictor:
        super().fit(adata, train, condition_key=condition_key, control=control)
        labels = adata.obs[condition_key].astype(str).to_numpy()
        X = dense(adata.X[labels == control]).astype(np.float64)
        self.index_ = {g: i for i, g in enumerate(self.genes_)}
        if self.graph is None:
            fitted = labels == control
            if self.interventions:
                fitted = fitted | np.isin(labels, [c for c in map(str, train) if c != control])
            if self.max_cells is not None and fitted.sum() > self.max_cells:
                drawn = np.random.default_rng(self.seed).choice(np.flatnonzero(fitted), self.max_cells, replace=False)
                fitted = np.isin(np.arange(labels.size), drawn)
            X_fit = dense(adata.X[fitted]).astype(np.float64)
            self.fitted_cells_ = list(map(str, adata.obs_names[fitted]))
            mask = self._intervention_mask(labels[fitted], control) if self.interventions else None
            dag, eq = self._step1(X_fit, X, mask)
        else:
            A = self.graph.toarray() if sp.issparse(self.graph) else np.asarray(self.graph)
            if A.shape != (X.shape[1], X.shape[1]):
                raise CapeInputError(f"graph has shape {A.shape}, expected {X.shape[1]} × {X.shape[1]} genes")
            dag = A
            eq = linear_equations(X, dag)
        self.dag_ = np.asarray(dag)
        self.n_edges_ = int(np.count_nonzero(dag))
        self.equations_, self.X_ = eq, X
        self.target_levels_, self.unseen_shift_ = self._target_levels(adata, labels, train, control) \
            if self.value == "training" else ({}, 0.0)
        logger.info("SCM predictor (%s equations%s): %d edges", self.equations,
                    ", interventions" if self.interventions else "", self.n_edges_)
        return self

    def _step1(self, X_fit: np.ndarray, X: np.ndarray, mask) -> tuple[np.ndarray, object]:
        """Step I on ``X_fit`` (intervention ``mask`` or ``None``): the DAG over every gene, and its equations."""
        if self.config is None:
            rank = self.rank if self.rank is not None and self.rank < X.shape[1] else None
            fit = fit_variational_notears(X_fit.astype(np.float32), rank=rank, epochs=self.epochs, seed=self.seed,
                                          device="cpu", intervened=mask, progress_desc="Step I (SCM predictor)")
            self.tau_, _ = choose_tau(fit.adjacency, "auto", 0.5)
            dag, _ = make_dag(fit.adjacency, self.tau_)
            model, mean, std = fit.model, fit.mean, fit.std
        else:
            graph = learn_causal_graph(X_fit, np.asarray(self.genes_), self.config, intervened=mask, device="cpu",
                                       seed=self.seed)
            cols = np.flatnonzero(np.isin(np.asarray(self.genes_), graph.genes))
            if cols.size < len(self.genes_):  # Step I drops constant genes; the equations need every gene
                raise CapeInputError(f"{len(self.genes_) - cols.size} gene(s) are constant in the cells Step I "
                                     "reads; leave them out of the data")
            dag, model, mean, std = np.asarray(graph.dag), graph.fit.model, graph.fit.mean, graph.fit.std
        eq = learned_equations(model, mean, std, X_fit, dag) if self.equations == "learned" \
            else linear_equations(X, dag)
        return dag, eq

    def _intervention_mask(self, labels: np.ndarray, control: str) -> sp.csr_matrix:
        """Cells × genes, True where the cell's condition perturbs that gene (control cells: no entry)."""
        rows, cols = [], []
        for cond in dict.fromkeys(labels):
            cells = np.flatnonzero(labels == cond)
            for g in condition_genes(cond) if cond != control else ():
                if g not in self.index_:
                    raise CapeInputError(f"training condition {cond!r} names {g!r}, which is not a gene of the data")
                rows.append(cells)
                cols.append(np.full(cells.size, self.index_[g]))
        rows = np.concatenate(rows) if rows else np.zeros(0, dtype=int)
        cols = np.concatenate(cols) if cols else np.zeros(0, dtype=int)
        return sp.csr_matrix((np.ones(rows.size, dtype=bool), (rows, cols)), shape=(labels.size, len(self.index_)))

    def _target_levels(self, adata: ad.AnnData, labels: np.ndarray, train: Sequence[str], control: str
                       ) -> tuple[dict[str, float], float]:
        """Each training target's mean level in the cells perturbing it, and the median of their shifts from the
        control mean (what an unseen target is moved by)."""
        perturbed = [c for c in dict.fromkeys(map(str, train)) if c != control]
        if not perturbed:
            raise CapeInputError("value='training' needs training perturbations: the split left none")
        control_mean = self.X_.mean(0)
        levels = {}
        for g in dict.fromkeys(g for c in perturbed for g in condition_genes(c)):
            cells = np.isin(labels, [c for c in perturbed if g in condition_genes(c)])
            levels[g] = float(dense(adata.X[cells][:, [self.index_[g]]]).mean())
        shift = float(np.median([levels[g] - control_mean[self.index_[g]] for g in levels]))
        return levels, shift

    def target_value(self, gene: str) -> float:
        """The value ``gene`` is set to when a perturbation targets it (see ``value``)."""
        if self.value != "training":
            return float(self.value)
        if gene in self.target_levels_:
            return self.target_levels_[gene]
        return float(self.X_[:, self.index_[gene]].mean() + self.unseen_shift_)

    def predict(self, conditions: Sequence[str]) -> pd.DataFrame:
        rows = []
        for cond in conditions:
            do = {self.index_[g]: self.target_value(g) for g in condition_genes(cond)}
            predicted, _ = intervene(self.equations_, self.X_, do, mode="counterfactual")
            rows.append(predicted.mean(0))
        return pd.DataFrame(np.vstack(rows) if rows else np.zeros((0, len(self.genes_))), index=list(conditions),
                            columns=self.genes_)
