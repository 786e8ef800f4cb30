"""Perturbation-prediction benchmark in the GEARS setting (Roohani et al. 2023; CAPE Sec. 5.2, Supp. E.1).

* Input: GEARS format, ``obs["condition"]`` ``"ctrl"`` / ``"A+ctrl"`` / ``"A+B"``
  (see :mod:`cape.data.perturbation_data`).
* Split: GEARS' "simulation" split, reimplemented from its description (:func:`simulation_split`).
* Metrics: per test perturbation, over its top-20 differentially expressed genes (scanpy ``rank_genes_groups``
  against control, ``rankby_abs=True``): the MSE between the mean predicted and the mean true expression, and
  GEARS'/scGPT's ``pearson_delta``, the Pearson correlation of the predicted and the true change from the control
  mean; each averaged over perturbations, overall and per subgroup (:meth:`PerturbationTask.evaluate`). The
  Virtual Cell Challenge's evaluator scores the same predictions: :func:`cape.tasks.cell_eval_scores` (extra
  ``perturb``).
* Predictors (:mod:`cape.tasks.perturbation_predictors`): "no change" (control mean), "additive" (sum of the seen
  singles' shifts), Ahlmann-Eltze et al.'s "train_mean" and "linear" baselines, and
  :class:`EmbeddingPerturbationPredictor`, which maps gene embeddings (e.g. from a transformer backbone) to the
  post-perturbation mean expression.
* Other spellings of the labels (``non-targeting``, ``A_B``, ...) are converted by :func:`to_gears_conditions`.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import anndata as ad
import numpy as np
import pandas as pd
import scanpy as sc

from .._arrays import dense
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
        raise CapeInputError(f"condition {condition!r} is not in GEARS format ('ctrl', 'A+ctrl', 'A+B'); "
                             "cape.tasks.to_gears_conditions converts other spellings")
    return tuple(p for p in parts if p != CONTROL)


# Spellings of a control cell, compared case-insensitively and ignoring '-', '_' and spaces.
_CONTROL_WORDS = frozenset({"ctrl", "control", "nontargeting", "nt", "negativecontrol", "unperturbed"})
_SEPARATORS = re.compile(r"[+|,;]")  # never part of a gene symbol; '_' is, so it is split with care
_SYMBOL = re.compile(r"[A-Za-z][A-Za-z0-9.\-]*")  # a letter, then letters, digits, '.' or '-' (HLA-A, NKX2-1)
_MAX_UNDERSCORES = 8  # the readings of a name grow as 2^underscores; real labels have one or two


def _is_control(word: str) -> bool:
    return re.sub(r"[\s_\-]", "", word).lower() in _CONTROL_WORDS


def _looks_like_gene(word: str) -> bool:
    """A gene symbol's shape, and not a guide ID's (``sgA``, ``guide2``, ``gRNA_1``)."""
    return bool(_SYMBOL.fullmatch(word)) and not word.startswith("sg") and not re.search("guide|grna", word, re.I)


def _groupings(tokens: list[str]) -> list[list[str]]:
    """Every way to rejoin consecutive ``_``-separated tokens: ``[a, b, c]`` → ``a|b|c``, ``a_b|c``, ..."""
    if len(tokens) == 1:
        return [tokens]
    out = []
    for rest in _groupings(tokens[1:]):
        out.append([tokens[0], *rest])
        out.append([f"{tokens[0]}_{rest[0]}", *rest[1:]])
    return out


def _read_piece(piece: str, genes: frozenset[str] | None) -> list[str] | str:
    """The targets (or ``ctrl``) of one separator-free piece of a label, or why it cannot be read."""
    piece = piece.strip()
    if not piece:
        return "an empty part"
    if _is_control(piece):
        return [CONTROL]
    tokens = piece.split("_")
    if len(tokens) > _MAX_UNDERSCORES + 1:
        return "too many '_'"
    if genes is None:
        bad = [t for t in tokens if not (_is_control(t) or _looks_like_gene(t))]
        if bad:
            return f"{bad[0]!r} is not a gene symbol"
        return [CONTROL if _is_control(t) else t for t in tokens]
    readings = [r for r in _groupings(tokens) if all(p in genes or _is_control(p) for p in r)]
    if len(readings) > 1:
        return f"{piece!r} splits into genes in {len(readings)} ways"
    if not readings:
        return f"{piece!r} is not a gene of the data"
    return [p if p in genes else CONTROL for p in readings[0]]


def _read_label(label: object, genes: frozenset[str] | None) -> list[str] | str:
    """A label's targets and controls in the order written, or why it is not a perturbation."""
    if label is None or (isinstance(label, float) and np.isnan(label)):
        return "a missing label"
    parts: list[str] = []
    for piece in _SEPARATORS.split(str(label)):
        read = _read_piece(piece, genes)
        if isinstance(read, str):
            return read
        parts += read
    targets = [p for p in parts if p != CONTROL]
    if len(targets) > 2:
        return "more than two target genes"
    if len(set(targets)) < len(targets):
        return "the same gene twice"
    return parts


def _gears_form(parts: list[str]) -> str:
    targets = [p for p in parts if p != CONTROL]
    if not targets:
        return CONTROL
    if len(targets) == 2:
        return "+".join(targets)
    return f"{CONTROL}+{targets[0]}" if parts[0] == CONTROL and len(parts) == 2 else f"{targets[0]}+{CONTROL}"


def to_gears_conditions(labels: Sequence[str] | pd.Series, genes: Sequence[str] | None = None) -> pd.Series:
    """Perturbation labels in common spellings, rewritten as GEARS conditions (``ctrl``, ``A+ctrl``, ``A+B``).

    Parameters
    ----------
    labels
        One label per cell, e.g. ``adata.obs["perturbation"]``. Read as:

        * ``ctrl``, ``control``, ``non-targeting``, ``non_targeting``, ``NT``, ``negative_control``,
          ``unperturbed`` (any case) → ``ctrl``;
        * ``A`` → ``A+ctrl``; ``A+ctrl`` and ``ctrl+A`` are kept;
        * ``A+B``, ``A_B``, ``A|B``, ``A,B``, ``A;B`` → ``A+B``, the genes in the order written (GEARS' own
          data keep the order of the source, and :func:`condition_genes` reads either).

        One perturbation written two ways in the column (``A+B`` and ``B_A``; ``A+ctrl`` and ``ctrl+A``) gets
        one label, ``A+ctrl`` or the genes sorted, so that it is one condition.
    genes
        The gene names of the data (``adata.var_names``). Gene symbols may contain ``_``, so with ``genes`` a
        name is split at ``_`` only into parts that are all genes (or control words), and every target must be
        a gene of the data; without it, every ``_`` separates genes and a part need only look like a symbol.

    Returns
    -------
    The conditions, one per label, with the index of ``labels`` when it is a Series (assign it to
    ``adata.obs["condition"]`` directly). Converting conditions already in GEARS form changes nothing.

    Raises
    ------
    CapeInputError
        For labels that name no perturbation this way — guide IDs (``sgA_1``, ``A_sg2``), empty or missing
        labels, more than two genes, a name that splits into genes in several ways — listing up to three.
    """
    series = labels if isinstance(labels, pd.Series) else pd.Series(list(labels), dtype=object)
    known = None if genes is None else frozenset(map(str, genes))
    read = {label: _read_label(label, known) for label in pd.unique(series.to_numpy(dtype=object))}
    bad = {label: why for label, why in read.items() if isinstance(why, str)}
    if bad:
        shown = "; ".join(f"{label!r} ({why})" for label, why in list(bad.items())[:3])
        hint = "" if genes is not None else " (pass genes=adata.var_names when gene names contain '_')"
        raise CapeInputError(f"{len(bad)} perturbation label(s) name no gene perturbation: {shown}; map guides "
                             f"to their target genes and write each label as 'ctrl', 'A+ctrl' or 'A+B'{hint}")
    form = {label: _gears_form(parts) for label, parts in read.items()}
    spellings: dict[frozenset[str], set[str]] = {}
    for label, parts in read.items():
        spellings.setdefault(frozenset(parts) - {CONTROL}, set()).add(form[label])
    for label, parts in read.items():
        targets = [p for p in parts if p != CONTROL]
        if len(spellings[frozenset(targets)]) > 1:  # one perturbation, one condition
            form[label] = "+".join(sorted(targets)) if len(targets) == 2 else f"{targets[0]}+{CONTROL}"
    return pd.Series([form[label] for label in series.to_numpy(dtype=object)], index=series.index,
                     name="condition", dtype=object)


def label_column(adata: ad.AnnData, key: str, option: str) -> pd.Series:
    """``obs[key]`` as strings, refused in one line (naming ``option``, the setting that named the column) when the
    column is missing or a cell is unlabelled."""
    if key not in adata.obs:
        raise CapeInputError(f"{option}={key!r}: no such column in adata.obs (it should hold per-cell GEARS "
                             f"labels: '{CONTROL}', 'A+{CONTROL}', 'A+B')")
    labels = adata.obs[key]
    if labels.isna().any():
        raise CapeInputError(f"obs[{key!r}] has {int(labels.isna().sum())} missing label(s): label every cell "
                             f"('{CONTROL}' for controls)")
    return labels.astype(str)


def intervention_labels(adata: ad.AnnData, key: str) -> tuple[np.ndarray, dict[str, tuple[str, ...]]]:
    """Every cell's GEARS label in ``obs[key]`` and the genes each label targets, checked against ``var_names``.

    What Step I's ``interventions=`` reads (:func:`cape.tl.intervention_mask`, :func:`cape.pp.preprocess`).
    Raises :class:`cape.CapeInputError` for a missing column, an unlabelled cell, a label not in GEARS form
    (``"ctrl"``, ``"A+ctrl"``, ``"A+B"``) or a target that is not a gene of ``adata``.

    Returns
    -------
    The labels as strings (one per cell), and each distinct label's targets (``()`` for control), in order of
    first appearance.
    """
    labels = label_column(adata, key, "interventions").to_numpy()
    targets = {c: condition_genes(c) for c in dict.fromkeys(labels)}
    genes = set(map(str, adata.var_names))
    unknown = [g for g in dict.fromkeys(g for t in targets.values() for g in t) if g not in genes]
    if unknown:
        raise CapeInputError(f"obs[{key!r}] names {len(unknown)} intervened gene(s) not in var_names, e.g. "
                             f"{unknown[0]!r} (labels must be GEARS conditions: '{CONTROL}', 'A+{CONTROL}', 'A+B')")
    return labels, targets


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
def condition_means(adata: ad.AnnData, conditions: Sequence[str], *, condition_key: str = "condition"
                    ) -> pd.DataFrame:
    """Mean expression per condition (rows) and gene (columns)."""
    labels = adata.obs[condition_key].astype(str).to_numpy()
    rows = {}
    for c in conditions:
        mask = labels == c
        if not mask.any():
            raise CapeInputError(f"condition {c!r} has no cells")
        rows[c] = dense(adata.X[mask]).mean(axis=0)
    return pd.DataFrame.from_dict(rows, orient="index", columns=adata.var_names.astype(str))


def top_de_genes(adata: ad.AnnData, conditions: Sequence[str] | None = None, *, condition_key: str = "condition",
                 control: str = CONTROL, n_genes: int = 20, method: str = "t-test") -> dict[str, list[str]]:
    """Top ``n_genes`` differentially expressed genes of each condition against control.

    As GEARS: scanpy ``rank_genes_groups(groupby=condition, reference=control, rankby_abs=True)`` with the t-test,
    on the expression in ``X`` (log-normalised). The input AnnData is not modified.
    """

    labels = adata.obs[condition_key].astype(str)
    groups = sorted(set(labels) - {control}) if conditions is None else [str(c) for c in conditions]
    keep = labels.isin(set(groups) | {control}).to_numpy()
    sub = ad.AnnData(X=dense(adata.X[keep]).astype(np.float32), obs=pd.DataFrame(
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


def top_de_pearson_delta(predicted: pd.DataFrame, truth: pd.DataFrame, control_mean: pd.Series,
                         de_genes: Mapping[str, Sequence[str]]) -> pd.Series:
    """Per condition: Pearson correlation over its DE genes of the predicted and the true change from the control
    mean (GEARS' and scGPT's ``pearson_delta``).

    A prediction (or a truth) with no variation over the DE genes — e.g. "no change", every delta 0 — has no
    defined correlation; it scores 0 (it carries no information about the direction of the change), so that
    averages over conditions stay finite and such a predictor cannot look good.
    """
    out = {}
    for cond in truth.index:
        if cond not in predicted.index:
            raise CapeInputError(f"no prediction for condition {cond!r}")
        genes = list(de_genes[cond])
        base = control_mean[genes].to_numpy(float)
        pred = predicted.loc[cond, genes].to_numpy(float) - base
        true = truth.loc[cond, genes].to_numpy(float) - base
        pred, true = pred - pred.mean(), true - true.mean()
        tol = 1e-9 * max(float(np.abs(base).max(initial=0.0)), 1.0)  # constant up to round-off: no variation
        if np.abs(pred).max(initial=0.0) <= tol or np.abs(true).max(initial=0.0) <= tol:
            out[cond] = 0.0
        else:
            out[cond] = float((pred @ true) / np.sqrt((pred @ pred) * (true @ true)))
    return pd.Series(out, name="top_de_pearson_delta")


def downstream_de(de_genes: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Each condition's DE genes without the perturbed genes themselves: the downstream effects only.

    In knock-out data the target's own drop is usually the largest DE effect, and any gene embedding that tells
    genes apart (or carries their expression level) lets a predictor find it; scores on the downstream genes
    show what an embedding knows beyond that.
    """
    return {c: [g for g in genes if g not in condition_genes(c)] for c, genes in de_genes.items()}


def summarise(per_condition: pd.Series, split: PerturbationSplit) -> dict[str, float]:
    """Average per-condition MSE overall and per subgroup (NaN where a subgroup is empty)."""
    summary = {"overall": float(per_condition.mean())}
    for g, conds in split.test_by_subgroup().items():
        vals = per_condition.reindex(conds).dropna()
        summary[g] = float(vals.mean()) if len(vals) else float("nan")
    return summary


# ----------------------------------------------------------------------------------------------------------------
# the task: split, DE genes and truth computed once, any predictor scored on them
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class PerturbationTask:
    """Split, DE genes and true means of a GEARS-format dataset, computed once for every model."""

    adata: ad.AnnData
    split: object
    de: dict
    truth: pd.DataFrame
    train: list[str]
    condition_key: str = "condition"
    control: str = "ctrl"
    control_mean: pd.Series | None = None

    @classmethod
    def build(cls, adata: ad.AnnData, *, condition_key: str = "condition", control: str = "ctrl",
              split_seed: int = 1, n_de: int = 20) -> PerturbationTask:
        conditions = validate_perturbation_data(adata, condition_key=condition_key, control=control)
        split = simulation_split(conditions, seed=split_seed)
        de = top_de_genes(adata, split.test, condition_key=condition_key, control=control, n_genes=n_de)
        truth = condition_means(adata, split.test, condition_key=condition_key)
        control_mean = condition_means(adata, [control], condition_key=condition_key).iloc[0]
        return cls(adata, split, de, truth, split.train + split.val, condition_key, control, control_mean)

    @property
    def control_cells(self) -> ad.AnnData:
        return self.adata[(self.adata.obs[self.condition_key].astype(str) == self.control).to_numpy()].copy()

    def score(self, predictor) -> dict[str, float]:
        """Fit ``predictor`` on the training perturbations; top-DE MSE and pearson_delta per subgroup plus all
        singles / all doubles (``mse_*``, ``pearson_delta_*``), and both over the downstream DE genes only
        (``*_downstream_overall``, :func:`downstream_de`)."""
        return self.evaluate(predictor)[2]

    def evaluate(self, predictor) -> tuple[pd.DataFrame, pd.Series, dict[str, float]]:
        """Fit ``predictor``; (predicted test means, per-condition top-DE MSE, summary as in :meth:`score`)."""
        predictor.fit(self.adata, self.train, condition_key=self.condition_key, control=self.control)
        predicted = predictor.predict(self.split.test)
        per = top_de_mse(predicted, self.truth, self.de)
        control_mean = self.control_mean
        if control_mean is None:
            control_mean = condition_means(self.adata, [self.control], condition_key=self.condition_key).iloc[0]
        out = {}
        for name, values in (("mse", per),
                             ("pearson_delta", top_de_pearson_delta(predicted, self.truth, control_mean, self.de))):
            summary = summarise(values, self.split)
            n = pd.Series({c: len(condition_genes(c)) for c in values.index})
            out |= {f"{name}_single": float(values[n == 1].mean()) if (n == 1).any() else float("nan"),
                    f"{name}_double": float(values[n == 2].mean()) if (n == 2).any() else float("nan"),
                    f"{name}_overall": summary["overall"]}
            out |= {f"{name}_{g}": v for g, v in summary.items() if g.startswith("combo")}
        downstream = downstream_de(self.de)
        out["mse_downstream_overall"] = float(top_de_mse(predicted, self.truth, downstream).mean())
        out["pearson_delta_downstream_overall"] = float(
            top_de_pearson_delta(predicted, self.truth, control_mean, downstream).mean())
        return predicted, per, out
