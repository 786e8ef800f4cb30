"""Perturbation predictors (GEARS setting, CAPE Sec. 5.2): "no change" (control mean), "additive" (sum of the seen
singles' shifts), "train_mean" (the training perturbations' mean), "linear" (Ahlmann-Eltze et al.'s PCA-embedding
linear model) and :class:`EmbeddingPerturbationPredictor`, which maps gene embeddings (e.g. from a transformer
backbone) to the post-perturbation mean expression; plus gene embeddings for baselines and tests.

Every predictor has ``name``, ``fit(adata, train, *, condition_key, control) -> self`` and
``predict(conditions) -> DataFrame`` (conditions × genes, predicted mean expression).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence

import anndata as ad
import networkx as nx
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch
from sklearn.decomposition import PCA
from torch import nn

from .._arrays import dense, zscore_columns
from .._errors import CapeInputError
from .perturbation import CONTROL, condition_genes, condition_means

logger = logging.getLogger("cape")

# ----------------------------------------------------------------------------------------------------------------
# predictors
# ----------------------------------------------------------------------------------------------------------------
def _shifts(adata: ad.AnnData, conditions: Sequence[str], control_mean: np.ndarray, condition_key: str
            ) -> np.ndarray:
    return condition_means(adata, conditions, condition_key=condition_key).to_numpy() - control_mean


class NoChangePredictor:
    """Predicts the control mean for every perturbation."""

    name = "no_change"

    def fit(self, adata: ad.AnnData, train: Sequence[str], *, condition_key: str = "condition",
            control: str = CONTROL) -> NoChangePredictor:
        self.genes_ = adata.var_names.astype(str)
        self.control_mean_ = condition_means(adata, [control], condition_key=condition_key).to_numpy()[0]
        return self

    def predict(self, conditions: Sequence[str]) -> pd.DataFrame:
        return pd.DataFrame(np.tile(self.control_mean_, (len(conditions), 1)), index=list(conditions),
                            columns=self.genes_)


class AdditivePredictor(NoChangePredictor):
    """Control mean plus the sum of the training single perturbations' mean shifts.

    A double A+B gets ``ctrl + Δ_A + Δ_B``; a gene without a training single contributes no shift, so unseen
    singles fall back to "no change" and a double with one seen gene gets that gene's shift.
    """

    name = "additive"

    def fit(self, adata: ad.AnnData, train: Sequence[str], *, condition_key: str = "condition",
            control: str = CONTROL) -> AdditivePredictor:
        super().fit(adata, train, condition_key=condition_key, control=control)
        singles = [c for c in train if len(condition_genes(c)) == 1]
        shifts = _shifts(adata, singles, self.control_mean_, condition_key) if singles else np.zeros((0, 0))
        self.single_shift_ = {condition_genes(c)[0]: shifts[i] for i, c in enumerate(singles)}
        return self

    def predict(self, conditions: Sequence[str]) -> pd.DataFrame:
        out = super().predict(conditions)
        for cond in conditions:
            for g in condition_genes(cond):
                if g in self.single_shift_:
                    out.loc[cond] += self.single_shift_[g]
        return out


def _training_perturbations(train: Sequence[str], control: str) -> list[str]:
    """The distinct training conditions besides control; at least one."""
    perts = [c for c in dict.fromkeys(map(str, train)) if c != control]
    if not perts:
        raise CapeInputError(f"no training perturbations: pass conditions besides {control!r} in train")
    return perts


class TrainingMeanPredictor(NoChangePredictor):
    """Predicts, for every perturbation, the mean over the training perturbations of their mean expression.

    The "mean" baseline of Ahlmann-Eltze, Huber & Anders (Nat. Methods 2025): the control mean plus the average
    training shift, one profile for all conditions. Each training perturbation counts once, whatever its number
    of cells (a mean of condition means), and control cells are not among them. It knows which genes respond to
    perturbations in general, nothing about which perturbation was made.
    """

    name = "train_mean"

    def fit(self, adata: ad.AnnData, train: Sequence[str], *, condition_key: str = "condition",
            control: str = CONTROL) -> TrainingMeanPredictor:
        super().fit(adata, train, condition_key=condition_key, control=control)
        perts = _training_perturbations(train, control)
        self.train_mean_ = condition_means(adata, perts, condition_key=condition_key).to_numpy().mean(axis=0)
        return self

    def predict(self, conditions: Sequence[str]) -> pd.DataFrame:
        for cond in conditions:
            condition_genes(cond)  # a label not in GEARS form is refused, as by the other predictors
        return pd.DataFrame(np.tile(self.train_mean_, (len(conditions), 1)), index=list(conditions),
                            columns=self.genes_)


class LinearPerturbationPredictor(NoChangePredictor):
    """The linear baseline of Ahlmann-Eltze, Huber & Anders (Nat. Methods 2025): ``Y ≈ G W Pᵀ + b``.

    * ``Y`` (genes × training columns): the pseudobulk (mean) expression change versus the control mean. As in
      the authors' code (``run_linear_pretrained_model.R``), the control pseudobulk is one training column,
      with zero change and a zero perturbation embedding.
    * ``G`` (genes × K), the gene embedding: the top-K principal-component scores of the genes in the training
      pseudobulk expression (genes as observations, each column centred over the genes, like R's ``prcomp``).
    * ``P`` (columns × K), the perturbation embedding: a perturbation of gene g is row g of ``G``; a double
      takes the sum of its two genes' rows, as the authors' double-perturbation script does, so that its
      predicted change is the sum of its singles' predicted changes around ``b``; control is the zero vector.
    * ``b``: the row means of ``Y`` (over the training perturbations and the control column).
    * ``W = (GᵀG + λI)⁻¹ Gᵀ (Y − b) P (PᵀP + λI)⁻¹``, ridge-regularised least squares.

    The prediction is ``control mean + b + G W pᵀ``. A perturbed gene that is not among the data's genes has no
    row in ``G``, so it adds nothing to ``p`` (a warning is logged): a condition of such genes alone is predicted
    as ``control mean + b``, what every condition tends to as λ → ∞ (the authors' script gives no prediction
    there). Training conditions must name genes of the data.

    Parameters
    ----------
    n_components
        K, the number of principal components (default 10, the ``--pca_dim`` default of the authors'
        ``run_linear_pretrained_model.R``). At most the rank of the centred training expression is used
        (:attr:`n_components_`): further components are zero and carry no gene information.
    ridge_penalty
        λ > 0, on both sides (default 0.1, the ``--ridge_penalty`` default of the same script).
    """

    name = "linear"

    def __init__(self, n_components: int = 10, ridge_penalty: float = 0.1) -> None:
        if isinstance(n_components, bool) or not isinstance(n_components, int | np.integer) or n_components < 1:
            raise CapeInputError(f"n_components must be a positive integer, got {n_components!r}")
        if not np.isfinite(ridge_penalty) or ridge_penalty <= 0:
            raise CapeInputError(f"ridge_penalty must be a positive number, got {ridge_penalty!r}")
        self.n_components, self.ridge_penalty = int(n_components), float(ridge_penalty)

    def fit(self, adata: ad.AnnData, train: Sequence[str], *, condition_key: str = "condition",
            control: str = CONTROL) -> LinearPerturbationPredictor:
        super().fit(adata, train, condition_key=condition_key, control=control)
        perts = _training_perturbations(train, control)
        self.index_ = {g: i for i, g in enumerate(self.genes_)}
        unknown = [c for c in perts if any(g not in self.index_ for g in condition_genes(c))]
        if unknown:
            raise CapeInputError(f"training condition(s) name genes absent from var_names: "
                                 f"{', '.join(unknown[:3])}; leave them out of train")
        expression = np.column_stack([self.control_mean_,
                                      condition_means(adata, perts, condition_key=condition_key).to_numpy().T])
        change = expression - self.control_mean_[:, None]
        self.gene_embedding_ = _pca_scores(expression, self.n_components)
        self.n_components_ = self.gene_embedding_.shape[1]
        pert = np.vstack([np.zeros(self.n_components_), self._embed(perts)])
        self.offset_ = change.mean(axis=1)
        self.coef_ = _ridge_bilinear(change - self.offset_[:, None], self.gene_embedding_, pert,
                                     self.ridge_penalty)
        return self

    def _embed(self, conditions: Sequence[str]) -> np.ndarray:
        """Perturbation embeddings (conditions × K): the sum of the perturbed genes' rows of ``G``."""
        out = np.zeros((len(conditions), self.n_components_))
        missing: dict[str, None] = {}
        for r, cond in enumerate(conditions):
            for g in condition_genes(cond):
                if g in self.index_:
                    out[r] += self.gene_embedding_[self.index_[g]]
                else:
                    missing[g] = None
        if missing:
            logger.warning("linear predictor: %d perturbed gene(s) not among the data's genes have no embedding "
                           "and add no change: %s", len(missing), ", ".join(list(missing)[:3]))
        return out

    def predict(self, conditions: Sequence[str]) -> pd.DataFrame:
        shift = self.gene_embedding_ @ self.coef_ @ self._embed(conditions).T  # genes × conditions
        return pd.DataFrame((self.control_mean_ + self.offset_)[None, :] + shift.T, index=list(conditions),
                            columns=self.genes_)


def simple_baselines() -> tuple[NoChangePredictor, ...]:
    """Fresh instances of the baselines every perturbation prediction is compared with: no change, the training
    perturbations' mean, additive and Ahlmann-Eltze et al.'s linear model (all deterministic)."""
    return NoChangePredictor(), TrainingMeanPredictor(), AdditivePredictor(), LinearPerturbationPredictor()


def _pca_scores(x: np.ndarray, k: int) -> np.ndarray:
    """Principal-component scores of the rows of ``x`` (columns centred), at most ``k`` and only non-zero ones."""
    u, s, _ = np.linalg.svd(x - x.mean(axis=0), full_matrices=False)
    # round-off components would only make the ridge system ill-conditioned
    rank = int(np.sum(s > s.max(initial=0.0) * max(x.shape) * np.finfo(float).eps))
    keep = min(k, rank)
    return u[:, :keep] * s[:keep]


def _ridge_bilinear(y: np.ndarray, g: np.ndarray, p: np.ndarray, penalty: float) -> np.ndarray:
    """``W = (GᵀG + λI)⁻¹ Gᵀ Y P (PᵀP + λI)⁻¹``: ridge least squares for ``Y ≈ G W Pᵀ``."""
    eye = np.eye(g.shape[1])
    left = np.linalg.solve(g.T @ g + penalty * eye, g.T @ y @ p)
    return np.linalg.solve(p.T @ p + penalty * eye, left.T).T


class EmbeddingPerturbationPredictor(NoChangePredictor):
    """Predict post-perturbation mean expression from gene embeddings (n_genes × d, e.g. a backbone's).

    Design (a small GEARS-like model whose only gene knowledge is the embedding matrix):

    * embeddings are z-scored per dimension, then fixed (not trained);
    * perturbation code ``p = MLP_p(Σ_{k ∈ perturbation} z_k)``: a sum, so a double of two seen genes composes
      their codes and an unseen gene is placed by its embedding alone;
    * gene-wise decoder: G(p, z_g, δ) = ``w · ReLU(U p + V z_g + t·δ) + b`` with δ = 1[g ∈ perturbation], one
      shared network applied to every gene, reading the gene's own embedding (and whether it is itself perturbed,
      which the experiment design tells us, as in GEARS);
    * the predicted shift is ``G(p, z_g, δ) − G(p₀, 0, δ)`` with p₀ the code of an all-zero embedding sum: no
      part of the prediction can bypass the embeddings. Without this, the network's biases and the
      self-indicator alone learnt "every gene moves by the average shift, the target drops", so constant
      (information-free) embeddings beat informative ones; now constant embeddings (z ≡ 0 after z-scoring)
      predict exactly the control mean, the no-change baseline, and row-permuted embeddings carry only
      scrambled knowledge (both are controls in the benchmarks);
    * trained by full-batch Adam on the training perturbations' mean shifts versus control (MSE over all genes),
      for a fixed number of epochs (no early stopping on the test split); prediction = control mean + shift.

    Everything random (initialisation) is drawn from ``seed``, so CPU results are reproducible. The tensors are
    small (perturbations × genes × hidden), so on CPU torch runs single-threaded during fit/predict
    (``num_threads=1``; the previous setting is restored): faster than intra-op threading on busy machines and
    independent of the core count. ``num_threads=None`` leaves torch's setting alone.
    """

    name = "embedding_mlp"

    def __init__(self, gene_embeddings: np.ndarray, *, hidden: int = 64, epochs: int = 400, lr: float = 3e-3,
                 weight_decay: float = 1e-4, seed: int = 0, device: str = "cpu", num_threads: int | None = 1
                 ) -> None:
        emb = np.asarray(gene_embeddings, dtype=np.float64)
        if emb.ndim != 2 or not np.isfinite(emb).all():
            raise CapeInputError(f"gene embeddings must be a finite 2-D array (n_genes × d), got shape {emb.shape}")
        self.gene_embeddings = emb
        self.hidden, self.epochs, self.lr, self.weight_decay = hidden, epochs, lr, weight_decay
        self.seed, self.device, self.num_threads = seed, device, num_threads

    def _indicator(self, conditions: Sequence[str]) -> np.ndarray:
        index = {g: i for i, g in enumerate(self.genes_)}
        ind = np.zeros((len(conditions), len(self.genes_)), dtype=np.float32)
        for r, cond in enumerate(conditions):
            for g in condition_genes(cond):
                ind[r, index[g]] = 1.0
        return ind

    def fit(self, adata: ad.AnnData, train: Sequence[str], *, condition_key: str = "condition",
            control: str = CONTROL) -> EmbeddingPerturbationPredictor:

        super().fit(adata, train, condition_key=condition_key, control=control)
        if self.gene_embeddings.shape[0] != adata.n_vars:
            raise CapeInputError(f"gene embeddings have {self.gene_embeddings.shape[0]} rows but the data has "
                                 f"{adata.n_vars} genes")
        if not train:
            raise CapeInputError("no training perturbations")
        z, _ = zscore_columns(self.gene_embeddings)
        target = _shifts(adata, train, self.control_mean_, condition_key)
        start = time.perf_counter()
        with _torch_threads(self.num_threads), torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.model_ = _ShiftModel(z.shape[1], self.hidden).to(self.device)
            self.z_ = torch.as_tensor(z, dtype=torch.float32, device=self.device)
            ind = torch.as_tensor(self._indicator(train), device=self.device)
            y = torch.as_tensor(target, dtype=torch.float32, device=self.device)
            opt = torch.optim.Adam(self.model_.parameters(), lr=self.lr, weight_decay=self.weight_decay)
            self.losses_ = []
            for _ in range(self.epochs):
                opt.zero_grad()
                loss = torch.mean((self.model_(self.z_, ind) - y) ** 2)
                loss.backward()
                opt.step()
                self.losses_.append(float(loss.detach()))
        self.fit_seconds_ = time.perf_counter() - start
        return self

    def predict(self, conditions: Sequence[str]) -> pd.DataFrame:
        ind = torch.as_tensor(self._indicator(conditions), device=self.device)
        with _torch_threads(self.num_threads), torch.no_grad():
            shift = self.model_(self.z_, ind).cpu().numpy().astype(np.float64)
        return pd.DataFrame(self.control_mean_ + shift, index=list(conditions), columns=self.genes_)


@contextlib.contextmanager
def _torch_threads(n: int | None):
    """Temporarily set torch's intra-op thread count (``None``: leave it)."""

    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _ShiftModel(nn.Module):
    """The decoder network of :class:`EmbeddingPerturbationPredictor`."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.pert = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.from_pert = nn.Linear(hidden, hidden)
        self.from_gene = nn.Linear(d, hidden, bias=False)
        self.self_flag = nn.Parameter(torch.zeros(hidden))
        self.out = nn.Linear(hidden, 1)

    def forward(self, z: torch.Tensor, indicator: torch.Tensor) -> torch.Tensor:
        # z: genes × d; indicator: perturbations × genes (1 where the gene is perturbed)
        p = self.pert(indicator @ z)  # sum of the perturbed genes' embeddings → code
        flag = indicator[..., None] * self.self_flag
        h = self.from_pert(p)[:, None, :] + self.from_gene(z)[None, :, :] + flag
        # the same network with every embedding zero (from_gene has no bias): what it predicts without gene
        # knowledge, subtracted so that an uninformative embedding predicts no change
        h0 = self.from_pert(self.pert(torch.zeros_like(z[:1])))[:, None, :] + flag
        return (self.out(torch.relu(h)) - self.out(torch.relu(h0))).squeeze(-1)


# ----------------------------------------------------------------------------------------------------------------
# embeddings for baselines and tests
# ----------------------------------------------------------------------------------------------------------------
def pca_gene_embeddings(adata: ad.AnnData, n_comps: int = 16, *, condition_key: str = "condition",
                        control: str = CONTROL, seed: int = 0) -> np.ndarray:
    """Gene embeddings from unperturbed cells only: PCA loadings (genes × n_comps) scaled by the singular values."""

    x = dense(adata.X[(adata.obs[condition_key].astype(str) == control).to_numpy()])
    k = min(n_comps, x.shape[0] - 1, x.shape[1])
    pca = PCA(n_components=k, random_state=seed).fit(x)
    return pca.components_.T * np.sqrt(pca.explained_variance_)[None, :]


def dag_gene_embeddings(adjacency, d: int = 16) -> np.ndarray:
    """Oracle gene embeddings from a known graph: the truncated SVD of its reachability matrix.

    ``R[i, j] = 1`` when a directed path leads from i to j (i ≠ j). The embedding ``[U_k S_k^½, V_k S_k^½]`` (with
    ``k = d // 2``) places genes with shared descendants, or shared ancestors, close together — the knowledge a
    causal positional encoding aims to carry. Used as an upper reference for the embedding predictor on simulated
    data, where the true DAG is known.
    """

    a = adjacency.toarray() if sp.issparse(adjacency) else np.asarray(adjacency)
    graph = nx.from_numpy_array(a != 0, create_using=nx.DiGraph)
    n = a.shape[0]
    reach = np.zeros((n, n))
    for i in range(n):
        reach[i, list(nx.descendants(graph, i))] = 1.0
    k = max(1, min(d // 2, n))
    u, s, vt = np.linalg.svd(reach)
    root = np.sqrt(s[:k])
    return np.hstack([u[:, :k] * root, vt[:k].T * root])


def random_gene_embeddings(n_genes: int, d: int = 16, *, seed: int = 0) -> np.ndarray:
    """Gaussian random gene embeddings: a control that carries no gene knowledge."""
    return np.random.default_rng(seed).normal(size=(n_genes, d))


def constant_gene_embeddings(n_genes: int, d: int = 16) -> np.ndarray:
    """The same vector for every gene: a control with no gene identity at all (it must not beat no-change)."""
    return np.ones((n_genes, d))


def permuted_gene_embeddings(embeddings: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """``embeddings`` with its rows (genes) shuffled: the same vectors, attached to the wrong genes."""
    emb = np.asarray(embeddings)
    return emb[np.random.default_rng(seed).permutation(emb.shape[0])]
