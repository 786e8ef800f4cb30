"""The perturbation workflow's computation (``cape perturb``): a Perturb-seq AnnData in, every predictor's
predictions of the held-out perturbations and their scores out.

* Labels: an ``obs`` column in GEARS form (``ctrl``, ``A+ctrl``, ``A+B``), other spellings converted by
  :func:`~cape.tasks.perturbation.to_gears_conditions` (:func:`gears_labels`).
* Split: GEARS' simulation split (:class:`~cape.tasks.perturbation.PerturbationTask`): whole perturbations held
  out (unseen singles; doubles with 0, 1 or 2 seen genes); :func:`split_table` records it.
* Predictors (:func:`run_perturbation_workflow`): the four simple baselines, Step I's learned equations fitted on
  the control cells alone and on the control cells plus the training perturbations as interventions, the
  least-squares refit of the interventional graph, (optionally) the transformer embedding predictor and GEARS
  (where its extra is installed; :mod:`~cape.tasks.perturbation_gears`), all behind the ``fit``/``predict``
  interface of :mod:`cape.tasks.perturbation_predictors`. No held-out perturbation's cells reach any fit.
* Scores: top-DE MSE and ``pearson_delta`` per held-out perturbation (:meth:`PerturbationTask.evaluate`), and
  cell-eval's metric suite (:func:`~cape.tasks.perturbation_cell_eval.cell_eval_scores`, columns ``cell_eval_*``)
  where the extra ``perturb`` is installed and ``cell_eval`` is on.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd

from .._errors import CapeInputError
from ..causal import CausalConfig
from .perturbation import (
    CONTROL,
    PerturbationTask,
    condition_genes,
    label_column,
    to_gears_conditions,
    top_de_pearson_delta,
)
from .perturbation_cell_eval import cell_eval_available, cell_eval_scores
from .perturbation_gears import INSTALL as GEARS_INSTALL
from .perturbation_gears import GearsPerturbationPredictor, gears_available
from .perturbation_predictors import simple_baselines
from .perturbation_scm import SCMPerturbationPredictor
from .perturbation_transformer import TransformerPerturbationPredictor

__all__ = ["PerturbationRun", "PerturbationSettings", "gears_labels", "perturbation_data",
           "run_perturbation_workflow", "split_table"]

logger = logging.getLogger("cape")

#: The baselines that know nothing about which perturbation was made; every verdict is against the better one.
TRIVIAL = ("no_change", "train_mean")
TARGET_VALUES = ("zero", "training")  # what the structural-equation predictors set a perturbed gene to

_GEARS = re.compile(r"[^+]+\+[^+]+")  # 'A+ctrl', 'ctrl+A', 'A+B'; control is the literal 'ctrl'


@dataclass
class PerturbationSettings:
    """Options of :func:`run_perturbation_workflow` (the workflow's ``perturb`` section)."""

    split_seed: int = 1
    n_de: int = 20
    causal_epochs: int = 30
    causal_cells: int | None = 2000
    rank: int | str | None = "auto"
    target_value: str = "zero"  # zero: do(x = 0), knock-outs; training: the targets' levels in the training cells
    transformer: bool = True
    pretrain_epochs: int = 5
    d_model: int = 32
    n_layers: int = 1
    n_heads: int = 2
    embed_dim: int = 8
    embed_epochs: int = 200
    predictor_epochs: int = 400
    seed: int = 0
    device: str = "cpu"
    cell_eval: bool = True
    gears: bool | str = "auto"  # GEARS: "auto" = where its extra imports, True = required, False = off
    gears_epochs: int = 2
    gears_cells: int | None = 2000  # the most cells GEARS reads (None: all)
    gears_go_graph: str | None = None  # GEARS' gene2go .pkl or go .csv; None: the interventional graph stands in


@dataclass
class PerturbationRun:
    """What :func:`run_perturbation_workflow` computed."""

    task: PerturbationTask
    predicted: dict[str, pd.DataFrame]  # predictor → held-out conditions × genes (predicted mean expression)
    per_perturbation: pd.DataFrame  # predictor, condition, subgroup, n_targets, top_de_mse, pearson_delta
    metrics: dict[str, dict[str, float]]  # predictor → PerturbationTask.evaluate's summary and fit seconds
    fitted_cells: dict[str, list[str]] = field(default_factory=dict)  # Step I predictors → the cells they read
    target_value: str = "zero"  # what the Step I predictors set a perturbed gene to (PerturbationSettings)


def gears_labels(adata: ad.AnnData, key: str) -> pd.Series:
    """``obs[key]`` as GEARS conditions: kept when every label already is one (``ctrl``, ``A+ctrl``, ``A+B``),
    else converted by :func:`~cape.tasks.perturbation.to_gears_conditions` against ``var_names`` (which refuses
    guide IDs and unknown spellings in one line)."""
    text = label_column(adata, key, "perturbations")
    if all(c == CONTROL or _GEARS.fullmatch(c) for c in pd.unique(text)):
        return text.rename(key)
    return to_gears_conditions(text, genes=adata.var_names).rename(key)


def perturbation_data(adata: ad.AnnData, key: str) -> ad.AnnData:
    """The cells × used genes (``var["cape_used"]`` when present) with GEARS labels in ``obs["condition"]``,
    refused in one line when the labels cannot be read, name genes absent from the data, have no control cells
    or fewer than two perturbations."""
    labels = gears_labels(adata, key)
    genes = adata.var["cape_used"].to_numpy(dtype=bool) if "cape_used" in adata.var else np.ones(adata.n_vars, bool)
    targets = {g for c in pd.unique(labels) if c != CONTROL for g in condition_genes(c)}
    absent = sorted(targets - set(map(str, adata.var_names)))
    if absent:
        raise CapeInputError(f"obs[{key!r}] perturbs {len(absent)} gene(s) absent from the matrix, e.g. "
                             f"{', '.join(absent[:3])}: keep them in the data (cape preprocess --interventions)")
    outside = sorted(targets - set(map(str, adata.var_names[genes])))
    if outside:  # constant after preprocessing: kept anyway, predictors need their columns
        logger.warning("perturbed gene(s) outside var['cape_used'] kept: %s", ", ".join(outside[:3]))
        genes |= adata.var_names.isin(outside)
    data = ad.AnnData(X=adata.X[:, genes], obs=pd.DataFrame({"condition": labels.to_numpy()}, index=adata.obs_names),
                      var=pd.DataFrame(index=adata.var_names[genes].astype(str)))
    n_control = int((labels == CONTROL).sum())
    if n_control == 0:
        raise CapeInputError(f"no control cells: no cell of obs[{key!r}] reads '{CONTROL}' (or control, "
                             "non-targeting, ...)")
    perturbations = sorted(set(labels) - {CONTROL})
    if len(perturbations) < 2:
        raise CapeInputError(f"obs[{key!r}] holds {len(perturbations)} perturbation(s) besides control; predicting "
                             "held-out perturbations needs at least two (one to train on, one to hold out)")
    return data


def split_table(task: PerturbationTask) -> pd.DataFrame:
    """One row per perturbation: ``condition``, ``role`` (train / val / test), ``subgroup`` (the test subgroup,
    else the role), ``n_targets`` and ``n_cells``."""
    split = task.split
    counts = task.adata.obs[task.condition_key].astype(str).value_counts()
    rows = [(c, role, split.subgroup.get(c, role)) for role, conds in
            (("train", split.train), ("val", split.val), ("test", split.test)) for c in conds]
    return pd.DataFrame({"condition": [r[0] for r in rows], "role": [r[1] for r in rows],
                         "subgroup": [r[2] for r in rows],
                         "n_targets": [len(condition_genes(r[0])) for r in rows],
                         "n_cells": [int(counts.get(r[0], 0)) for r in rows]})


def _predictors(settings: PerturbationSettings, gears: bool = False):
    """The predictors in scoring order; the transformer, the refit and GEARS (when ``gears``) follow the
    interventional fit whose graph they read."""
    s = settings
    yield from simple_baselines()
    # Step I as `cape causal` runs it (screen, fit, edge budget, orientation), on at most causal_cells cells
    config = CausalConfig(rank=s.rank, epochs=s.causal_epochs)
    value = 0.0 if s.target_value == "zero" else s.target_value
    control_only = SCMPerturbationPredictor(config=config, max_cells=s.causal_cells, seed=s.seed, value=value)
    control_only.name = "scm_control"
    yield control_only
    interventional = SCMPerturbationPredictor(config=config, max_cells=s.causal_cells, seed=s.seed,
                                              interventions=True, value=value)
    yield interventional
    refit = SCMPerturbationPredictor(interventional.dag_, equations="linear", value=value)
    refit.name = "scm_interventional_linear"
    yield refit
    if s.transformer:
        yield TransformerPerturbationPredictor(
            interventional.dag_, pretrain_epochs=s.pretrain_epochs, d_model=s.d_model, n_layers=s.n_layers,
            n_heads=s.n_heads, embed_dim=s.embed_dim, embed_epochs=s.embed_epochs,
            predictor_epochs=s.predictor_epochs, seed=s.seed, device=s.device)
    if gears:
        yield GearsPerturbationPredictor(s.gears_go_graph or interventional.dag_, epochs=s.gears_epochs,
                                         max_cells=s.gears_cells, seed=s.seed, device=s.device)


#: GEARS scores each perturbation's top 20 differentially expressed genes while it trains; on fewer genes it fails.
GEARS_MIN_GENES = 20


def _use_gears(setting: bool | str, n_genes: int) -> bool:
    """Whether the GEARS predictor runs: ``"auto"`` where GEARS imports and the data have
    :data:`GEARS_MIN_GENES` genes (else one log line saying why not), ``True`` always (a one-line error when it
    cannot), ``False`` never."""
    if setting not in (True, False, "auto"):
        raise CapeInputError(f"gears must be auto, true or false, got {setting!r}")
    if setting is False:
        return False
    if n_genes < GEARS_MIN_GENES:
        if setting is True:
            raise CapeInputError(f"gears is on but the data have {n_genes} genes; GEARS needs at least "
                                 f"{GEARS_MIN_GENES}: set gears to false or auto")
        logger.info("GEARS skipped: the data have %d genes, it needs at least %d", n_genes, GEARS_MIN_GENES)
        return False
    if gears_available():
        return True
    if setting is True:
        raise CapeInputError(f"gears is on but GEARS does not import: {GEARS_INSTALL}, or set gears to auto")
    logger.info("GEARS not installed: its predictor is skipped (%s adds it)", GEARS_INSTALL)
    return False


def _cell_eval(means: pd.DataFrame, task: PerturbationTask, settings: PerturbationSettings, summary: dict
               ) -> dict[str, dict[str, float]]:
    """cell-eval's scores of ``means`` per held-out condition (``cell_eval_<metric>``), their means added to
    ``summary``; nothing when it is off or not installed."""
    if not (settings.cell_eval and cell_eval_available()):
        return {}
    table, means_of = cell_eval_scores(means, task.adata, task.split.test, seed=settings.seed)
    summary.update({f"cell_eval_{k}": float(v) for k, v in means_of.items()})
    numeric = table.apply(pd.to_numeric, errors="coerce").dropna(axis=1, how="all")
    return {str(c): {f"cell_eval_{k}": float(v) for k, v in row.items()} for c, row in numeric.iterrows()}


def run_perturbation_workflow(data: ad.AnnData, settings: PerturbationSettings | None = None) -> PerturbationRun:
    """Split ``data`` (from :func:`perturbation_data`), fit every predictor on the control cells and the
    training perturbations, predict every held-out perturbation and score it."""
    settings = settings or PerturbationSettings()
    if settings.target_value not in TARGET_VALUES:
        raise CapeInputError(f"target_value must be one of {', '.join(TARGET_VALUES)}, got {settings.target_value!r}")
    if settings.cell_eval and not cell_eval_available():
        logger.info('cell-eval not installed: scored by top-DE MSE and pearson_delta only (pip install '
                    '"cape-sc[perturb]" adds its metrics)')
    gears = _use_gears(settings.gears, data.n_vars)  # a missing required GEARS or GO file stops here, before any fit
    go = settings.gears_go_graph
    if gears and go is not None and not (Path(go).suffix in (".pkl", ".csv") and Path(go).is_file()):
        raise CapeInputError(f"gears_go_graph {go}: not a file, or neither GEARS' gene2go .pkl nor a "
                             "source,target,importance .csv")
    task = PerturbationTask.build(data, split_seed=settings.split_seed, n_de=settings.n_de)
    subgroup = task.split.subgroup
    predicted, metrics, rows, fitted = {}, {}, [], {}
    for predictor in _predictors(settings, gears):
        start = time.perf_counter()
        means, mse, summary = task.evaluate(predictor)
        seconds = time.perf_counter() - start
        pearson = top_de_pearson_delta(means, task.truth, task.control_mean, task.de)
        predicted[predictor.name] = means
        metrics[predictor.name] = {**summary, "seconds": seconds}
        if hasattr(predictor, "fitted_cells_"):
            fitted[predictor.name] = predictor.fitted_cells_
        per_condition = _cell_eval(means, task, settings, metrics[predictor.name])
        rows += [{"predictor": predictor.name, "condition": c, "subgroup": subgroup[c],
                  "n_targets": len(condition_genes(c)), "top_de_mse": float(mse[c]),
                  "pearson_delta": float(pearson[c]), **per_condition.get(c, {})} for c in task.split.test]
        logger.info("%s: top-%d-DE MSE %.4g, pearson_delta %.3f (%.1f s)", predictor.name, settings.n_de,
                    summary["mse_overall"], summary["pearson_delta_overall"], seconds)
    return PerturbationRun(task, predicted, pd.DataFrame(rows), metrics, fitted, settings.target_value)
