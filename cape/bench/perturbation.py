"""Perturbation-prediction benchmark in the GEARS setting (Roohani et al. 2023; CAPE Sec. 5.2, Supp. E.1).

* Input: GEARS format, ``obs["condition"]`` ``"ctrl"`` / ``"A+ctrl"`` / ``"A+B"`` (see :mod:`cape.data.perturbation`).
* Split: GEARS' "simulation" split, reimplemented from its description (:func:`simulation_split`).
* Metric: per test perturbation, the MSE between the mean predicted and the mean true expression over its top-20
  differentially expressed genes (scanpy ``rank_genes_groups`` against control, ``rankby_abs=True``), averaged over
  perturbations, overall and per subgroup (:func:`evaluate`).
* Predictors: "no change" (control mean), "additive" (sum of the seen singles' shifts) and
  :class:`EmbeddingPerturbationPredictor`, which maps gene embeddings (e.g. from a transformer backbone) to the
  post-perturbation mean expression.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

from .._errors import CapeInputError

logger = logging.getLogger("cape")

CONTROL = "ctrl"
SUBGROUPS = ("unseen_single", "combo_seen0", "combo_seen1", "combo_seen2")


# ----------------------------------------------------------------------------------------------------------------
# conditions and validation
# ----------------------------------------------------------------------------------------------------------------
def condition_genes(condition: str) -> tuple[str, ...]:
    """Genes of a GEARS condition.

    ``"ctrl"`` → ``()``, ``"A+ctrl"`` or ``"ctrl+A"`` → ``("A",)``, ``"A+B"`` → ``("A", "B")``.
    """
    parts = str(condition).split("+")
    if len(parts) > 2 or any(not p for p in parts):
        raise CapeInputError(f"condition {condition!r} is not in GEARS format ('ctrl', 'A+ctrl', 'A+B')")
    return tuple(p for p in parts if p != CONTROL)


def validate_perturbation_data(adata: ad.AnnData, *, condition_key: str = "condition", control: str = CONTROL,
                               min_cells: int = 2) -> list[str]:
    """Check GEARS-format input and return the usable perturbation conditions (control excluded).

    Raises :class:`cape.CapeInputError` for a missing condition column, no control cells, a malformed condition or
    conditions naming genes absent from ``var_names`` (all listed). Conditions with fewer than ``min_cells`` cells
    are excluded with a warning (DE tests need at least 2 cells per group).
    """
    if condition_key not in adata.obs:
        raise CapeInputError(f"obs[{condition_key!r}] not found; perturbation data needs GEARS conditions "
                             "('ctrl', 'A+ctrl', 'A+B')")
    counts = adata.obs[condition_key].astype(str).value_counts()
    if counts.get(control, 0) == 0:
        raise CapeInputError(f"no control cells: no cell has obs[{condition_key!r}] == {control!r}")
    if counts[control] < min_cells:
        raise CapeInputError(f"only {counts[control]} control cell(s); at least {min_cells} are needed")
    genes = set(map(str, adata.var_names))
    missing: dict[str, None] = {}
    conditions = []
    for cond in sorted(c for c in counts.index if c != control):
        pert = condition_genes(cond)
        if not pert:
            raise CapeInputError(f"condition {cond!r} names no gene; use {control!r} for control cells")
        for g in pert:
            if g not in genes:
                missing[g] = None
        conditions.append(cond)
    if missing:
        raise CapeInputError(f"conditions name {len(missing)} gene(s) absent from the data: {', '.join(missing)}")
    small = [c for c in conditions if counts[c] < min_cells]
    if small:
        warnings.warn(f"{len(small)} condition(s) with fewer than {min_cells} cells excluded: {', '.join(small)}",
                      UserWarning, stacklevel=2)
        logger.warning("excluded conditions with fewer than %d cells: %s", min_cells, ", ".join(small))
    usable = [c for c in conditions if counts[c] >= min_cells]
    if not usable:
        raise CapeInputError("no perturbation condition with at least 2 cells besides control")
    return usable


# ----------------------------------------------------------------------------------------------------------------
# GEARS "simulation" split
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class PerturbationSplit:
    """Train / validation / test perturbations and the test subgroups."""

    train: list[str]
    val: list[str]
    test: list[str]
    subgroup: dict[str, str] = field(default_factory=dict)  # test condition → one of SUBGROUPS
    params: dict = field(default_factory=dict)

    def test_by_subgroup(self) -> dict[str, list[str]]:
        return {g: [c for c in self.test if self.subgroup[c] == g] for g in SUBGROUPS}


def _split_once(perts: Sequence[str], seed: int, gene_frac: float, combo_frac: float
                ) -> tuple[list[str], list[str], dict[str, str]]:
    """One round of the simulation split: seen genes, then train singles/combos and test subgroups."""
    rng = np.random.RandomState(seed)  # legacy generator, as GEARS seeds numpy's global one
    genes = sorted({g for p in perts for g in condition_genes(p)})
    n_seen = int(len(genes) * gene_frac)
    seen = set(rng.choice(genes, n_seen, replace=False).tolist()) if n_seen else set()
    singles = [p for p in perts if len(condition_genes(p)) == 1]
    combos = [p for p in perts if len(condition_genes(p)) == 2]
    train = [p for p in singles if condition_genes(p)[0] in seen]
    subgroup = {p: "unseen_single" for p in singles if condition_genes(p)[0] not in seen}
    seen2 = []
    for p in combos:
        k = sum(g in seen for g in condition_genes(p))
        if k == 2:
            seen2.append(p)
        else:
            subgroup[p] = f"combo_seen{k}"
    n_train2 = int(len(seen2) * combo_frac)
    # GEARS re-seeds before drawing the training combos; a fresh generator with the same seed reproduces its split.
    rng = np.random.RandomState(seed)
    train2 = set(rng.choice(seen2, n_train2, replace=False).tolist()) if n_train2 else set()
    train += [p for p in seen2 if p in train2]
    subgroup.update({p: "combo_seen2" for p in seen2 if p not in train2})
    test = [p for p in perts if p in subgroup]
    return train, test, subgroup


def simulation_split(conditions: Sequence[str], *, seed: int = 1, train_gene_set_size: float = 0.75,
                     combo_seen2_train_frac: float = 0.75, val_frac: float = 0.9) -> PerturbationSplit:
    """GEARS' "simulation" split, reimplemented from its description (``DataSplitter.get_simulation_split``).

    1. A fraction ``train_gene_set_size`` of the perturbed genes (sorted, sampled with ``RandomState(seed)``) is
       "seen".
    2. Train: every single perturbation of a seen gene, plus ``combo_seen2_train_frac`` of the doubles whose two
       genes are both seen (drawn, in sorted order, by a fresh ``RandomState(seed)``).
    3. Test subgroups: ``unseen_single`` (singles of unseen genes), ``combo_seen0`` / ``combo_seen1`` (doubles with
       0 / 1 seen gene) and ``combo_seen2`` (the held-out doubles with both genes seen).
    4. Validation is carved from train by the same procedure with fractions ``val_frac`` (GEARS: 0.9 / 0.9).

    The same conditions and seed always give the same split (the input order does not matter).
    """
    perts = sorted({str(c) for c in conditions if str(c) != CONTROL})
    if not 0 < train_gene_set_size < 1 or not 0 <= combo_seen2_train_frac <= 1:
        raise CapeInputError("train_gene_set_size must be in (0, 1) and combo_seen2_train_frac in [0, 1]")
    genes = sorted({g for p in perts for g in condition_genes(p)})
    if len(genes) < 2 or int(len(genes) * train_gene_set_size) == 0 or \
            int(len(genes) * train_gene_set_size) == len(genes):
        raise CapeInputError(f"too few perturbed genes ({len(genes)}) for the simulation split with "
                             f"train_gene_set_size={train_gene_set_size}: need at least one seen and one unseen gene")
    train_all, test, subgroup = _split_once(perts, seed, train_gene_set_size, combo_seen2_train_frac)
    if not train_all:
        raise CapeInputError("the simulation split left no training perturbation (too few single perturbations)")
    if not test:
        raise CapeInputError("the simulation split left no test perturbation")
    train, val = train_all, []
    train_genes = {g for p in train_all for g in condition_genes(p)}
    if len(train_genes) >= 2 and int(len(train_genes) * val_frac) < len(train_genes):
        t, v, _ = _split_once(train_all, seed, val_frac, val_frac)
        if t:
            train, val = t, v
    return PerturbationSplit(train=train, val=val, test=test, subgroup=subgroup,
                             params={"split": "simulation", "seed": seed, "train_gene_set_size": train_gene_set_size,
                                     "combo_seen2_train_frac": combo_seen2_train_frac, "val_frac": val_frac})


# ----------------------------------------------------------------------------------------------------------------
# DE genes and the metric
# ----------------------------------------------------------------------------------------------------------------
def _dense(x) -> np.ndarray:
    return np.asarray(x.toarray() if sp.issparse(x) else x, dtype=np.float64)


def condition_means(adata: ad.AnnData, conditions: Sequence[str], *, condition_key: str = "condition"
                    ) -> pd.DataFrame:
    """Mean expression per condition (rows) and gene (columns)."""
    labels = adata.obs[condition_key].astype(str).to_numpy()
    rows = {}
    for c in conditions:
        mask = labels == c
        if not mask.any():
            raise CapeInputError(f"condition {c!r} has no cells")
        rows[c] = _dense(adata.X[mask]).mean(axis=0)
    return pd.DataFrame.from_dict(rows, orient="index", columns=adata.var_names.astype(str))


def top_de_genes(adata: ad.AnnData, conditions: Sequence[str] | None = None, *, condition_key: str = "condition",
                 control: str = CONTROL, n_genes: int = 20, method: str = "t-test") -> dict[str, list[str]]:
    """Top ``n_genes`` differentially expressed genes of each condition against control.

    As GEARS: scanpy ``rank_genes_groups(groupby=condition, reference=control, rankby_abs=True)`` with the t-test,
    on the expression in ``X`` (log-normalised). The input AnnData is not modified.
    """
    import scanpy as sc

    labels = adata.obs[condition_key].astype(str)
    groups = sorted(set(labels) - {control}) if conditions is None else [str(c) for c in conditions]
    keep = labels.isin(set(groups) | {control}).to_numpy()
    sub = ad.AnnData(X=_dense(adata.X[keep]).astype(np.float32), obs=pd.DataFrame(
        {"group": pd.Categorical(labels[keep].to_numpy())}, index=adata.obs_names[keep]),
        var=pd.DataFrame(index=adata.var_names.astype(str)))
    sub.uns["log1p"] = {"base": None}  # silence scanpy's "data not logarithmized" warning: X is log-scale
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # constant genes give NaN t statistics; ranked last
        warnings.simplefilter("ignore", pd.errors.PerformanceWarning)  # scanpy's own frame building
        sc.tl.rank_genes_groups(sub, groupby="group", groups=groups, reference=control, rankby_abs=True,
                                n_genes=min(n_genes, adata.n_vars), method=method)
    names = sub.uns["rank_genes_groups"]["names"]
    return {g: [str(n) for n in names[g]] for g in groups}


def top_de_mse(predicted: pd.DataFrame, truth: pd.DataFrame, de_genes: Mapping[str, Sequence[str]]) -> pd.Series:
    """Per condition: mean over its DE genes of (mean predicted − mean true expression)²."""
    out = {}
    for cond in truth.index:
        if cond not in predicted.index:
            raise CapeInputError(f"no prediction for condition {cond!r}")
        genes = list(de_genes[cond])
        diff = predicted.loc[cond, genes].to_numpy(float) - truth.loc[cond, genes].to_numpy(float)
        out[cond] = float(np.mean(diff**2))
    return pd.Series(out, name="top_de_mse")


def summarise(per_condition: pd.Series, split: PerturbationSplit) -> dict[str, float]:
    """Average per-condition MSE overall and per subgroup (NaN where a subgroup is empty)."""
    summary = {"overall": float(per_condition.mean())}
    for g, conds in split.test_by_subgroup().items():
        vals = per_condition.reindex(conds).dropna()
        summary[g] = float(vals.mean()) if len(vals) else float("nan")
    return summary


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


class EmbeddingPerturbationPredictor(NoChangePredictor):
    """Predict post-perturbation mean expression from gene embeddings (n_genes × d, e.g. a backbone's).

    Design (a small GEARS-like model whose only gene knowledge is the embedding matrix):

    * embeddings are z-scored per dimension, then fixed (not trained);
    * perturbation code ``p = MLP_p(Σ_{k ∈ perturbation} z_k)``: a sum, so a double of two seen genes composes
      their codes and an unseen gene is placed by its embedding alone;
    * gene-wise decoder: the shift of gene g is ``w · ReLU(U p + V z_g + t·1[g ∈ perturbation]) + b``, one shared
      network applied to every gene, reading the gene's own embedding (and whether it is itself perturbed, which
      the experiment design tells us, as in GEARS);
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
        import torch

        super().fit(adata, train, condition_key=condition_key, control=control)
        if self.gene_embeddings.shape[0] != adata.n_vars:
            raise CapeInputError(f"gene embeddings have {self.gene_embeddings.shape[0]} rows but the data has "
                                 f"{adata.n_vars} genes")
        if not train:
            raise CapeInputError("no training perturbations")
        sd = self.gene_embeddings.std(axis=0)
        z = (self.gene_embeddings - self.gene_embeddings.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
        target = _shifts(adata, train, self.control_mean_, condition_key)
        start = time.perf_counter()
        with _torch_threads(self.num_threads), torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.model_ = _build_shift_model(z.shape[1], self.hidden).to(self.device)
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
        import torch

        ind = torch.as_tensor(self._indicator(conditions), device=self.device)
        with _torch_threads(self.num_threads), torch.no_grad():
            shift = self.model_(self.z_, ind).cpu().numpy().astype(np.float64)
        return pd.DataFrame(self.control_mean_ + shift, index=list(conditions), columns=self.genes_)


@contextlib.contextmanager
def _torch_threads(n: int | None):
    """Temporarily set torch's intra-op thread count (``None``: leave it)."""
    import torch

    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _shift_model_class():
    import torch
    from torch import nn

    class ShiftModel(nn.Module):
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
            h = self.from_pert(p)[:, None, :] + self.from_gene(z)[None, :, :] + indicator[..., None] * self.self_flag
            return self.out(torch.relu(h)).squeeze(-1)

    return ShiftModel


def _build_shift_model(d: int, hidden: int):
    """The decoder network (built by a function so that torch is imported only when a model is trained)."""
    return _shift_model_class()(d, hidden)


# ----------------------------------------------------------------------------------------------------------------
# embeddings for baselines and tests
# ----------------------------------------------------------------------------------------------------------------
def pca_gene_embeddings(adata: ad.AnnData, n_comps: int = 16, *, condition_key: str = "condition",
                        control: str = CONTROL, seed: int = 0) -> np.ndarray:
    """Gene embeddings from unperturbed cells only: PCA loadings (genes × n_comps) scaled by the singular values."""
    from sklearn.decomposition import PCA

    x = _dense(adata.X[(adata.obs[condition_key].astype(str) == control).to_numpy()])
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
    import networkx as nx

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


# ----------------------------------------------------------------------------------------------------------------
# runner
# ----------------------------------------------------------------------------------------------------------------
def run_perturbation_benchmark(adata: ad.AnnData, *, dataset: str = "data",
                               gene_embeddings: Mapping[str, np.ndarray] | None = None,
                               condition_key: str = "condition", control: str = CONTROL, split_seed: int = 1,
                               seeds: Sequence[int] = (0,), n_de: int = 20, predictor_kwargs: dict | None = None,
                               ) -> list[dict]:
    """Split, DE genes, then no-change, additive and one embedding predictor per entry of ``gene_embeddings``.

    Returns records ``{task, dataset, method, seed, subgroup, metric, value, n_perturbations}``; ``subgroup`` is
    ``overall`` or one of :data:`SUBGROUPS`. The no-change and additive baselines are deterministic and reported
    once (seed ``None``); each embedding predictor runs once per seed.
    """
    conditions = validate_perturbation_data(adata, condition_key=condition_key, control=control)
    split = simulation_split(conditions, seed=split_seed)
    de = top_de_genes(adata, split.test, condition_key=condition_key, control=control, n_genes=n_de)
    truth = condition_means(adata, split.test, condition_key=condition_key)
    train = split.train + split.val  # no model selection here, so validation perturbations are trained on
    sizes = {g: len(c) for g, c in split.test_by_subgroup().items()} | {"overall": len(split.test)}

    def records(method: str, seed: int | None, predicted: pd.DataFrame) -> list[dict]:
        summary = summarise(top_de_mse(predicted, truth, de), split)
        return [{"task": "perturbation", "dataset": dataset, "method": method, "seed": seed, "subgroup": g,
                 "metric": f"top{n_de}_de_mse", "value": v, "n_perturbations": sizes[g]}
                for g, v in summary.items()]

    out = []
    for predictor in (NoChangePredictor(), AdditivePredictor()):
        predictor.fit(adata, train, condition_key=condition_key, control=control)
        out += records(predictor.name, None, predictor.predict(split.test))
    for name, emb in (gene_embeddings or {}).items():
        for seed in seeds:
            model = EmbeddingPerturbationPredictor(emb, seed=seed, **(predictor_kwargs or {}))
            model.fit(adata, train, condition_key=condition_key, control=control)
            out += records(f"{model.name}[{name}]", seed, model.predict(split.test))
    return out
