"""Perturbation predictions scored by the Virtual Cell Challenge's evaluator, ``cell-eval`` (Arc Institute).

cape's predictors (:mod:`cape.tasks.perturbation_predictors`, :mod:`cape.tasks.perturbation_scm`) predict one mean
expression profile per held-out condition. ``cell-eval`` scores predicted *cells* against observed cells; here the
predicted cells are made from the predicted means (:func:`predicted_cells`) and handed to its ``MetricsEvaluator``
with the observed cells of the same conditions, so that the scores are the field's shared ones
(:func:`cell_eval_scores`).

``cell-eval`` is an optional extra: ``pip install "cape-sc[perturb]"``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import tempfile
import warnings
from collections.abc import Sequence

import anndata as ad
import numpy as np
import pandas as pd
from scipy.stats import ConstantInputWarning

from .._arrays import dense
from .._errors import CapeInputError
from .perturbation import condition_genes

#: ``cell-eval``'s metric profiles (``MetricsEvaluator.compute(profile=...)``) that :func:`cell_eval_scores` takes.
PROFILES = ("full", "minimal", "vcc", "de", "anndata")

#: The metrics that read only each condition's mean (pseudobulk) profile, so that they are exact for a predictor of
#: means; the others (DE-based ones, ``pearson_edistance``, ``clustering_agreement``) also read the spread of the
#: predicted cells, which :func:`predicted_cells` borrows from control cells.
MEAN_LEVEL_METRICS = ("pearson_delta", "mse", "mae", "mse_delta", "mae_delta", "discrimination_score_l1",
                      "discrimination_score_l2", "discrimination_score_cosine")


def cell_eval_available() -> bool:
    """Whether ``cell-eval`` (the extra ``perturb``) is installed."""
    return importlib.util.find_spec("cell_eval") is not None


def _import_cell_eval():
    try:
        import cell_eval  # optional dependency (extra `perturb`)
    except ImportError as err:
        raise CapeInputError(f'cell-eval is not installed ({err}); pip install "cape-sc[perturb]"') from None
    return cell_eval


def _checked_means(predicted: pd.DataFrame, adata: ad.AnnData, conditions: Sequence[str] | None,
                   labels: np.ndarray, control: str) -> tuple[pd.DataFrame, list[str]]:
    """The predictions of ``conditions`` in the gene order of ``adata``, after checking every condition has one,
    observed cells, and the genes match."""
    conditions = [str(c) for c in (predicted.index if conditions is None else conditions)]
    if not conditions:
        raise CapeInputError("no condition to score")
    if control in conditions:
        raise CapeInputError(f"the control {control!r} is not a condition to score")
    missing = [c for c in conditions if c not in predicted.index]
    if missing:
        raise CapeInputError(f"no prediction for {len(missing)} condition(s), e.g. {missing[0]!r}")
    genes = adata.var_names.astype(str)
    if set(map(str, predicted.columns)) != set(genes):
        raise CapeInputError("the predicted columns are not the genes of adata.var_names")
    counts = pd.Series(labels).value_counts()
    if counts.get(control, 0) < 2:
        raise CapeInputError(f"cell-eval needs at least 2 control cells ({control!r}); found "
                             f"{int(counts.get(control, 0))}")
    few = [c for c in conditions if counts.get(c, 0) < 2]
    if few:
        raise CapeInputError(f"{len(few)} condition(s) have fewer than 2 observed cells, e.g. {few[0]!r}")
    means = predicted.rename(columns=str).loc[conditions, list(genes)].astype(float)
    if not np.isfinite(means.to_numpy()).all():
        raise CapeInputError("the predicted means contain NaN or infinite values")
    return means, conditions


def predicted_cells(means: pd.DataFrame, control_x: np.ndarray, n_cells: Sequence[int], *,
                    seed: int = 0) -> np.ndarray:
    """Cells whose mean is exactly each predicted mean, made from control cells.

    For condition ``k``, ``n_cells[k]`` control cells are drawn (without replacement when there are enough, with a
    seeded generator); gene by gene, with ``m`` the drawn cells' mean and ``p`` the prediction clipped at 0:

    * ``p ≥ m``: every cell is shifted by ``p − m`` (the control cells' spread is kept);
    * ``p < m``: every cell is scaled by ``p / m`` (a decrease shrinks the cells towards 0, as a knock-down does,
      and no cell turns negative — which cell-eval refuses, and which shifting would need to clip, biasing the mean).

    Returns
    -------
    ``(sum(n_cells), n_genes)`` float32, the conditions' blocks in the order of ``means``' rows.
    """
    rng = np.random.default_rng(seed)
    n_control = control_x.shape[0]
    blocks = []
    for k, n in enumerate(n_cells):
        idx = rng.choice(n_control, size=int(n), replace=int(n) > n_control)
        cells = control_x[idx].astype(np.float64)
        base = cells.mean(axis=0)
        target = np.clip(means.iloc[k].to_numpy(float), 0.0, None)
        up = target >= base
        # m > 0 wherever p < m (p ≥ 0), so the ratio is defined where it is used
        ratio = np.divide(target, base, out=np.ones_like(base), where=~up)
        blocks.append(np.where(up, cells + (target - base), cells * ratio))
    return np.vstack(blocks).astype(np.float32) if blocks else np.empty((0, control_x.shape[1]), np.float32)


def _cell_eval_names(conditions: list[str], control: str) -> dict[str, str]:
    """cell-eval's name of each condition: a single ``A+ctrl`` is ``A``, as in the Virtual Cell Challenge, so
    that cell-eval leaves the target gene out of ``discrimination_score_*``; a double keeps its name."""
    names = {c: condition_genes(c)[0] if len(condition_genes(c)) == 1 else c for c in conditions}
    if len(set(names.values()) | {control}) != len(conditions) + 1:  # a gene named like a condition or the control
        return {c: c for c in conditions}
    return names


def _anndata_pair(means: pd.DataFrame, adata: ad.AnnData, conditions: list[str], labels: np.ndarray,
                  names: dict[str, str], condition_key: str, control: str, seed: int
                  ) -> tuple[ad.AnnData, ad.AnnData]:
    """(observed, predicted) AnnData for cell-eval: each condition's cells and the control cells, the conditions
    under their cell-eval ``names``."""
    genes = pd.DataFrame(index=adata.var_names.astype(str))
    keep = np.isin(labels, [*conditions, control])
    real_labels = np.array([names.get(label, label) for label in labels[keep]], dtype=object)
    real = ad.AnnData(X=dense(adata.X[keep]).astype(np.float32), var=genes.copy(),
                      obs=pd.DataFrame({condition_key: real_labels}, index=[f"real_{i}" for i in range(keep.sum())]))
    if real.X.min(initial=0.0) < 0:
        raise CapeInputError("cell-eval needs non-negative expression (log-normalised counts); adata.X has negative "
                             "values")
    control_x = dense(adata.X[labels == control]).astype(np.float32)
    n_cells = [int((labels == c).sum()) for c in conditions]
    x = np.vstack([control_x, predicted_cells(means, control_x, n_cells, seed=seed)])
    pred_labels = np.concatenate([np.full(len(control_x), control, dtype=object),
                                  np.repeat(np.asarray([names[c] for c in conditions], dtype=object), n_cells)])
    pred = ad.AnnData(X=x, var=genes.copy(),
                      obs=pd.DataFrame({condition_key: pred_labels}, index=[f"pred_{i}" for i in range(len(x))]))
    return real, pred


def _per_condition(results: pd.DataFrame, names: dict[str, str], means: pd.DataFrame, control_x: np.ndarray,
                   condition_key: str) -> pd.DataFrame:
    """cell-eval's results as conditions (under their cape names, in the order of ``means``) × metrics."""
    table = results.set_index("perturbation")
    table.index = table.index.astype(str).map({name: c for c, name in names.items()})
    table = table.reindex(list(means.index))
    table.index.name = condition_key
    if "pearson_delta" in table:
        # cell-eval correlates float32 round-off where a prediction does not move from the control mean; like
        # cape's top_de_pearson_delta, such a prediction carries no direction and scores 0
        control_mean = control_x.astype(np.float64).mean(axis=0)
        shift = np.abs(means.to_numpy() - control_mean).max(axis=1)
        flat = shift <= 1e-6 * max(float(np.abs(control_mean).max(initial=0.0)), 1.0)
        table.loc[means.index[flat], "pearson_delta"] = 0.0
    return table


@contextlib.contextmanager
def _quiet():
    """cell-eval's and pdex's progress bars (tqdm, on stderr) and their log lines (e.g. counts of infinite fold
    changes of genes absent from the control cells) kept out of cape's output, which reports the scores itself."""
    loggers = [logging.getLogger(name) for name in ("cell_eval", "pdex")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


def cell_eval_scores(predicted: pd.DataFrame, adata: ad.AnnData, conditions: Sequence[str] | None = None, *,
                     condition_key: str = "condition", control: str = "ctrl", profile: str = "minimal",
                     log1p: bool = True, seed: int = 0, num_threads: int = 1
                     ) -> tuple[pd.DataFrame, dict[str, float]]:
    """Score predicted mean expression with ``cell-eval``'s ``MetricsEvaluator``, per condition and on average.

    Observed cells: those of ``conditions`` and the control cells in ``adata``. Predicted cells: the same control
    cells, and for each condition as many cells as it has observed ones, made from control cells so that their mean
    is exactly the predicted mean (:func:`predicted_cells`: increases shift the cells, decreases scale them).

    For a predictor of means, the metrics in :data:`MEAN_LEVEL_METRICS` (``pearson_delta`` — cell-eval's
    correlation of the predicted and observed change from control over *all* genes —, ``mse``, ``mae``,
    ``discrimination_score_*``) read only the means and are exact. The DE metrics (``overlap_at_N``,
    ``precision_at_N``, ``de_*``, ``pr_auc``, ``roc_auc``; Wilcoxon tests by ``pdex``) also read the spread of the
    predicted cells, which is the control cells' (scaled where expression drops): they say whether a predicted
    shift is large against the control spread, not whether a predictor knows the cells' spread. A condition whose
    prediction does not move from the control mean (the "no change" baseline) has no defined ``pearson_delta``
    (cell-eval would correlate float round-off); it scores 0, as in cape's own
    :func:`~cape.tasks.perturbation.top_de_pearson_delta`. cell-eval sees a single ``A+ctrl`` as ``A`` (the
    challenge's naming), so that ``discrimination_score_*`` leave its target gene out as in the challenge; for a
    double both targets count.

    Parameters
    ----------
    predicted
        Predicted mean expression: conditions (rows, GEARS form ``A+ctrl``, ``A+B``) × genes (columns: the genes
        of ``adata.var_names``, any order), on the scale of ``adata.X``, e.g. from a predictor's ``predict``.
    adata
        The observed cells, ``obs[condition_key]`` holding GEARS conditions, ``X`` non-negative (log-normalised).
    conditions
        The conditions to score (default: every row of ``predicted``); each needs ≥ 2 observed cells.
    condition_key, control
        The ``obs`` column of the conditions and the control's label.
    profile
        cell-eval's metric set: ``"minimal"`` (default: ``pearson_delta``, ``mse``, ``mae``,
        ``discrimination_score_l1``, ``overlap_at_N``, ``precision_at_N``, ``de_nsig_counts``), ``"vcc"`` (the
        challenge's three: ``mae``, ``discrimination_score_l1``, ``overlap_at_N``), ``"anndata"`` (the mean- and
        cell-level metrics, no DE), ``"de"`` (DE only) or ``"full"``.
    log1p
        Whether ``X`` is ``log1p`` of normalised counts (``pdex`` computes fold changes from ``expm1`` of it).
        cell-eval's own guess, and its conversion of integer counts, are turned off: the predictions are on the
        scale of ``X``, so both sides are scored on it.
    seed
        Seed of the draws of control cells (:func:`predicted_cells`).
    num_threads
        Threads of cell-eval's DE step (``pdex``, numba).

    Returns
    -------
    Per-condition metrics (rows: ``conditions`` in order; columns: cell-eval's metric names, e.g.
    ``pearson_delta``, ``overlap_at_N``, ``de_nsig_counts_real``; metrics that cell-eval computes once over all
    conditions, such as ``de_spearman_sig``, repeat on every row), and the mean of each column over conditions.

    Examples
    --------
    With the split, truth and a predictor of :class:`cape.tasks.PerturbationTask`::

        task = PerturbationTask.build(adata)
        predicted, _, _ = task.evaluate(AdditivePredictor())
        per_condition, summary = cell_eval_scores(predicted, task.adata, task.split.test)
        summary["pearson_delta"], summary["overlap_at_N"], summary["discrimination_score_l1"]

    Raises
    ------
    CapeInputError
        Without the extra (one line: ``pip install "cape-sc[perturb]"``), an unknown ``profile``, a condition
        without a prediction or with fewer than 2 observed cells, fewer than 2 control cells, columns that are not
        the genes of ``adata``, non-finite predictions or negative ``X``.
    """
    cell_eval = _import_cell_eval()
    if profile not in PROFILES:
        raise CapeInputError(f"profile={profile!r}: cell-eval's profiles are {', '.join(PROFILES)}")
    if condition_key not in adata.obs:
        raise CapeInputError(f"obs[{condition_key!r}] not found; it should hold GEARS conditions")
    labels = adata.obs[condition_key].astype(str).to_numpy(dtype=object)
    means, conditions = _checked_means(predicted, adata, conditions, labels, control)
    names = _cell_eval_names(conditions, control)
    real, pred = _anndata_pair(means, adata, conditions, labels, names, condition_key, control, seed)
    with tempfile.TemporaryDirectory(prefix="cape_cell_eval_") as tmp, _quiet():  # its DE tables go to tmp
        evaluator = cell_eval.MetricsEvaluator(
            adata_pred=pred, adata_real=real, control_pert=control, pert_col=condition_key,
            num_threads=num_threads, outdir=os.path.join(tmp, "cell_eval"), allow_discrete=True,
            pdex_kwargs={"is_log1p": log1p})
        with warnings.catch_warnings():
            # a no-change prediction's constant delta: its pearson_delta is set below
            warnings.simplefilter("ignore", ConstantInputWarning)
            # break_on_error: cell-eval otherwise logs a failing metric and leaves its column out
            results, _ = evaluator.compute(profile=profile, write_csv=False, break_on_error=True)
    table = _per_condition(results.to_pandas(), names, means, dense(adata.X[labels == control]), condition_key)
    summary = {str(name): float(np.nanmean(col)) if np.isfinite(col).any() else float("nan")
               for name, col in table.astype(float).items()}
    return table, summary
