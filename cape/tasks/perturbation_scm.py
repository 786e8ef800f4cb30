"""The structural-equation predictor of the perturbation benchmark: knock-outs as do(x = 0) in a causal model fitted
on the control cells alone (Step I's learned SEM, or a DAG refit by least squares), no perturbed cell used."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

from .._arrays import dense
from .._errors import CapeInputError
from ..causal import fit_variational_notears, intervene, learned_equations, linear_equations, make_dag
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
        The value the perturbed genes are set to (0: knock-out).
    rank, epochs, seed
        Step I settings (``graph=None`` only).

    The prediction for a condition is the mean over the control cells of their counterfactuals (each cell
    keeps its abducted noise). Training perturbations are not used: the model sees only unperturbed cells.
    """

    name = "scm"

    def __init__(self, graph=None, *, equations: str = "learned", value: float = 0.0, rank: int | None = 40,
                 epochs: int = 100, seed: int = 0) -> None:
        if equations not in ("learned", "linear"):
            raise CapeInputError(f"equations must be 'learned' or 'linear', got {equations!r}")
        if equations == "learned" and graph is not None:
            raise CapeInputError("learned equations come from Step I's own fit: pass graph=None, or equations='linear'")
        self.graph, self.equations, self.value = graph, equations, float(value)
        self.rank, self.epochs, self.seed = rank, epochs, seed

    def fit(self, adata: ad.AnnData, train: Sequence[str], *, condition_key: str = "condition",
            control: str = CONTROL) -> SCMPerturbationPredictor:
        super().fit(adata, train, condition_key=condition_key, control=control)
        X = dense(adata.X[(adata.obs[condition_key].astype(str) == control).to_numpy()]).astype(np.float64)
        self.index_ = {g: i for i, g in enumerate(self.genes_)}
        if self.graph is None:
            rank = self.rank if self.rank is not None and self.rank < X.shape[1] else None
            fit = fit_variational_notears(X.astype(np.float32), rank=rank, epochs=self.epochs, seed=self.seed,
                                          device="cpu", progress_desc="Step I (SCM predictor)")
            tau, _ = choose_tau(fit.adjacency, "auto", 0.5)
            dag, _ = make_dag(fit.adjacency, tau)
            self.tau_ = tau
            eq = learned_equations(fit.model, fit.mean, fit.std, X, dag) if self.equations == "learned" \
                else linear_equations(X, dag)
        else:
            A = self.graph.toarray() if sp.issparse(self.graph) else np.asarray(self.graph)
            if A.shape != (X.shape[1], X.shape[1]):
                raise CapeInputError(f"graph has shape {A.shape}, expected {X.shape[1]} × {X.shape[1]} genes")
            dag = A
            eq = linear_equations(X, dag)
        self.n_edges_ = int(np.count_nonzero(dag))
        self.equations_, self.X_ = eq, X
        logger.info("SCM predictor (%s equations): %d edges", self.equations, self.n_edges_)
        return self

    def predict(self, conditions: Sequence[str]) -> pd.DataFrame:
        rows = []
        for cond in conditions:
            do = {self.index_[g]: self.value for g in condition_genes(cond)}
            predicted, _ = intervene(self.equations_, self.X_, do, mode="counterfactual")
            rows.append(predicted.mean(0))
        return pd.DataFrame(np.vstack(rows) if rows else np.zeros((0, len(self.genes_))), index=list(conditions),
                            columns=self.genes_)
