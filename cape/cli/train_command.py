"""``cape train`` (pretrain + fine-tune a CellTransformer, write the model and ``obsm["X_cape"]``) and
``cape-bench pretrain`` (pretraining throughput and loss per backbone × encoding).

Multi-process: ``torchrun --nproc_per_node N -m cape train ...`` trains with DDP (NCCL on GPUs, gloo on CPU);
only rank 0 writes outputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
from pathlib import Path

from .._errors import CapeInputError
from .._io import write_h5ad
from .._settings import resolve_seed
from ..models import CellTransformer, TrainingPlan
from ..models.hyperparameters import DEFAULT_RECIPE, FINE_TUNE_PLAN
from ..models.tokenize import MAX_AUTO_LEN
from ..models.training import distributed
from ..report.metrics import FINE_TUNED_KEY
from ..tasks.annotation import fine_tune_cells, record_split, split_roles
from ..tasks.labels import checked_labels, resolve_label_key
from ._command_io import check_output, max_len_value, positive_int, read_input


def _option(value: str) -> tuple[str, object]:
    if "=" not in value:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    key, raw = value.split("=", 1)
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        parsed = raw
    return key.strip(), parsed


def register(commands) -> None:
    train = commands.add_parser("train", help="pretrain (masked values + cell profiles) and fine-tune a transformer; "
                                              "embed cells")
    train.add_argument("--input", "-i", required=True, help="input .h5ad (log-normalised; CAPE keys for 'cape')")
    train.add_argument("--output", "-o", required=True, help="output .h5ad with obsm['X_cape'] (and predictions)")
    train.add_argument("--model-dir", default=None, help="model folder (default: <output without .h5ad>_model)")
    train.add_argument("--label-key", default=None,
                       help="obs column to fine-tune on; 'auto' = the named dataset's labels; 'none' or absent: "
                            "no fine-tuning")
    train.add_argument("--fine-tune-fraction", type=float, default=0.3,
                       help="fine-tune on this stratified fraction of the labelled cells and keep the rest as test "
                            "cells in obs['cape_split'] (paper: 0.3); 1 fine-tunes on every labelled cell")
    train.add_argument("--checkpoint", default=None, metavar="DIR",
                       help="start from a published scGPT checkpoint folder (args.json, vocab.json, best_model.pt): "
                            "its size and gene vocabulary replace --d-model/--n-layers/--n-heads, --encoding is "
                            "swapped in, then pretraining and fine-tuning run as usual")
    train.add_argument("--architecture", choices=["scgpt", "scbert"], default="scgpt")
    train.add_argument("--encoding", default="cape", help="positional encoding (see `cape encodings`)")
    train.add_argument("--integration", choices=["auto", "complement", "replace"], default="auto",
                       help="complement: keep the backbone's gene embedding beside the encoding; replace: the encoding "
                            "takes its place (CAPE Supp. F.2); auto: the architecture's default (complement)")
    train.add_argument("--encoding-option", type=_option, action="append", default=[], metavar="KEY=VALUE",
                       help="encoding option, repeatable (value parsed as JSON when possible)")
    train.add_argument("--layer", default=None, help="expression layer (default X)")
    train.add_argument("--use-raw", action="store_true", help="use adata.raw")
    train.add_argument("--vocabulary", choices=["used", "all"], default="used",
                       help="model genes: 'used' = var['cape_used'] (the genes of Steps I–III; all genes when "
                            "absent), 'all' = every gene of the matrix (memory grows with it) (used)")
    train.add_argument("--d-model", type=int, default=64)
    train.add_argument("--n-layers", type=int, default=2)
    train.add_argument("--n-heads", type=int, default=4)
    train.add_argument("--max-len", type=max_len_value, default=DEFAULT_RECIPE.max_len,
                       help="tokens per cell incl. <cls>; 'auto' covers every expressed gene of the vocabulary "
                            f"(at most {MAX_AUTO_LEN:,}) ({DEFAULT_RECIPE.max_len})")
    train.add_argument("--dropout", type=float, default=DEFAULT_RECIPE.dropout,
                       help=f"dropout of the residual and feed-forward paths ({DEFAULT_RECIPE.dropout})")
    train.add_argument("--pretrain-epochs", type=int, default=DEFAULT_RECIPE.pretrain_epochs,
                       help="self-supervised pretraining epochs on every cell (masked values + the <cls> state's "
                            "reconstruction of each cell's profile); obsm['X_cape'] is read after it, before any "
                            f"label is seen; 0 skips ({DEFAULT_RECIPE.pretrain_epochs})")
    train.add_argument("--cell-weight", type=float, default=DEFAULT_RECIPE.cell_weight,
                       help="weight of the cell-profile reconstruction in pretraining; 0: masked values only "
                            f"({DEFAULT_RECIPE.cell_weight})")
    train.add_argument("--mask-ratio", type=float, default=0.15)
    train.add_argument("--epochs", type=int, default=100,
                       help="most fine-tuning epochs; early stopping usually ends sooner (100)")
    train.add_argument("--batch-size", type=int, default=32, help="per process (32)")
    train.add_argument("--length-grouping", type=_grouping, default=TrainingPlan.length_grouping, metavar="N",
                       help="batch cells of similar token counts together (less padding): each epoch's shuffled "
                            "cells are sorted by length within pools of N batches; 0: a plain shuffle "
                            f"({TrainingPlan.length_grouping})")
    train.add_argument("--lr", type=float, default=DEFAULT_RECIPE.pretrain_lr,
                       help=f"pretraining learning rate ({DEFAULT_RECIPE.pretrain_lr})")
    train.add_argument("--validation-fraction", type=float, default=0.1)
    train.add_argument("--patience", type=positive_int, default=DEFAULT_RECIPE.pretrain_patience,
                       help="pretraining early-stopping patience in epochs (default: none, every epoch runs and the "
                            "best validation epoch is kept)")
    fit = train.add_argument_group("fine-tuning (annotation head)")
    fit.add_argument("--fit-lr", type=float, default=DEFAULT_RECIPE.fit_lr,
                     help=f"fine-tuning learning rate ({DEFAULT_RECIPE.fit_lr})")
    fit.add_argument("--fit-patience", type=int, default=DEFAULT_RECIPE.fit_patience,
                     help=f"fine-tuning early-stopping patience ({DEFAULT_RECIPE.fit_patience})")
    fit.add_argument("--fit-min-delta", type=float, default=DEFAULT_RECIPE.fit_min_delta,
                     help="fine-tuning stops after --fit-patience epochs in which the validation accuracy did not rise "
                          "and the validation loss did not fall by more than this below its best "
                          f"({DEFAULT_RECIPE.fit_min_delta})")
    fit.add_argument("--fit-ceiling-patience", type=positive_int, default=DEFAULT_RECIPE.fit_ceiling_patience,
                     help="...or after this many such epochs while the validation accuracy is 1.0 "
                          f"({DEFAULT_RECIPE.fit_ceiling_patience}; --fit-patience's value waits as long there)")
    fit.add_argument("--fit-validation-fraction", type=float, default=0.2,
                     help="validation share of the fine-tune cells, for early stopping (0.2)")
    fit.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (0.01)")
    fit.add_argument("--class-weight", choices=["balanced", "none"], default="balanced",
                     help="'balanced' weights the cross-entropy by inverse class frequency (balanced)")
    fit.add_argument("--pooling", choices=["cls", "mean", "cls+mean"], default="mean",
                     help="cell embedding for the annotation head and obsm['X_cape_fine_tuned'] (mean of gene tokens)")
    fit.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant",
                     help="fine-tuning learning-rate schedule (constant)")
    fit.add_argument("--warmup-fraction", type=float, default=0.0,
                     help="linear warm-up share of the fine-tuning steps (0)")
    fit.add_argument("--early-stopping-metric", choices=["val_loss", "val_accuracy", "val_balanced_accuracy"],
                     default="val_loss", help="validation score that picks the kept fine-tuning epoch (val_loss)")
    train.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    out = check_output(args.output, args.input)
    model_dir = Path(args.model_dir) if args.model_dir else out.with_name(out.stem + "_model")
    check_output(str(model_dir), args.input, args.output, args.checkpoint, suffix=None, option="--model-dir")
    distributed.init_from_env()
    try:
        adata = read_input(args.input, expect_counts=False)
        label_key = resolve_label_key(adata, None if args.label_key in (None, "none") else args.label_key)
        fit_data = _fine_tune_cells(adata, label_key, args.fine_tune_fraction) if label_key else None
        if args.checkpoint is not None:
            model = _from_checkpoint(args, adata)
        else:
            model = CellTransformer(adata, args.architecture, args.encoding, layer=args.layer,
                                    use_raw=args.use_raw, d_model=args.d_model, n_layers=args.n_layers,
                                    n_heads=args.n_heads, max_len=args.max_len, dropout=args.dropout,
                                    encoding_options=dict(args.encoding_option), device="auto", seed=None,
                                    vocabulary=args.vocabulary,
                                    integration=None if args.integration == "auto" else args.integration)
        logging.getLogger("cape").info("%r", model)
        unsupervised = None
        if args.pretrain_epochs > 0:
            model.pretrain(adata, epochs=args.pretrain_epochs, mask_ratio=args.mask_ratio,
                           batch_size=args.batch_size, cell_weight=args.cell_weight, plan=_pretrain_plan(args))
            if distributed.is_main_process():
                unsupervised = model.get_latent_representation(adata, pooling="cls")
        fine_tuned = fit_data is not None and args.epochs > 0
        if fine_tuned:
            model.train(fit_data, label_key, epochs=args.epochs, batch_size=args.batch_size,
                        plan=_fine_tune_plan(args),
                        class_weight=None if args.class_weight == "none" else args.class_weight,
                        pooling=args.pooling)
        if distributed.is_main_process():
            _embed(model, adata, unsupervised, fine_tuned)
            if model.labels is not None:
                model.predict(adata, key_added=f"cape_{label_key}_prediction")
            existed = model_dir.exists()
            model.save(model_dir, overwrite=True)  # a rerun replaces its own model (check_output guards inputs)
            adata.uns["cape"]["model"]["model_dir"] = str(model_dir)
            try:
                write_h5ad(adata, out)
            except BaseException:
                if not existed:  # leave no half-finished run behind
                    shutil.rmtree(model_dir, ignore_errors=True)
                raise
    finally:
        distributed.shutdown()
    return 0


def _grouping(value: str) -> int | None:
    """``--length-grouping``: batches per sorted pool, a whole number ≥ 0 (0: a plain shuffle, ``None``)."""
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 (0: a plain shuffle), got {value!r}")
    return n or None


def _pretrain_plan(args: argparse.Namespace) -> TrainingPlan:
    """``--lr``, ``--validation-fraction``, ``--patience``, ``--length-grouping`` (AdamW's weight decay and clipping
    at their defaults)."""
    return TrainingPlan(lr=args.lr, validation_fraction=args.validation_fraction,
                        early_stopping_patience=args.patience, length_grouping=args.length_grouping)


def _fine_tune_plan(args: argparse.Namespace) -> TrainingPlan:
    """The fine-tuning options (``--fit-lr``, ``--weight-decay``, ``--fit-validation-fraction``, ``--fit-patience``,
    ``--fit-min-delta``, ``--fit-ceiling-patience``, ``--lr-schedule``, ``--warmup-fraction``,
    ``--early-stopping-metric``, ``--length-grouping``) over :data:`~cape.models.hyperparameters.FINE_TUNE_PLAN`
    (which scores keep training going)."""
    return dataclasses.replace(FINE_TUNE_PLAN, lr=args.fit_lr, weight_decay=args.weight_decay,
                               validation_fraction=args.fit_validation_fraction,
                               early_stopping_patience=args.fit_patience, early_stopping_min_delta=args.fit_min_delta,
                               early_stopping_ceiling_patience=args.fit_ceiling_patience,
                               lr_schedule=args.lr_schedule, warmup_fraction=args.warmup_fraction,
                               early_stopping_metric=args.early_stopping_metric,
                               length_grouping=args.length_grouping)


def _embed(model: CellTransformer, adata, unsupervised, fine_tuned: bool) -> None:
    """``obsm["X_cape"]``: the cell embedding before any label was seen (the pretrained ``<cls>`` state), when
    there was pretraining; else the model's only one. After fine-tuning, the fine-tuned embedding also goes to
    ``obsm["X_cape_fine_tuned"]``. ``uns["cape"]["model"]["embedding"]`` says which ``X_cape`` holds."""
    model.embed(adata)  # gene embeddings, and X_cape from the final model
    if fine_tuned:
        adata.obsm[FINE_TUNED_KEY] = adata.obsm["X_cape"]
    if unsupervised is not None:
        adata.obsm["X_cape"] = unsupervised
    kind = "pretrained" if unsupervised is not None else "fine_tuned" if fine_tuned else "untrained"
    adata.uns["cape"]["model"]["embedding"] = kind


def _from_checkpoint(args: argparse.Namespace, adata):
    """A CellTransformer on the scGPT checkpoint in ``args.checkpoint``, with ``args.encoding`` swapped in."""

    folder = Path(args.checkpoint)
    if not folder.is_dir():
        raise CapeInputError(f"--checkpoint folder not found: {folder}")
    if args.architecture != "scgpt":
        raise CapeInputError(f"--checkpoint loads an scGPT checkpoint; --architecture {args.architecture} does not "
                             "apply (use scgpt)")
    if args.integration == "replace":
        raise CapeInputError("--checkpoint keeps the checkpoint's learnt gene table (integration 'complement'); "
                             "--integration replace does not apply")
    logging.getLogger("cape").info("starting from the scGPT checkpoint %s (its d_model, n_layers, n_heads and gene "
                                   "vocabulary replace the options)", folder)
    return CellTransformer.from_scgpt(folder, adata, encoding=args.encoding,
                                      encoding_options=dict(args.encoding_option), layer=args.layer,
                                      use_raw=args.use_raw, max_len=args.max_len, dropout=args.dropout,
                                      device="auto", seed=None)


def _fine_tune_cells(adata, label_key: str, fraction: float):
    """The cells to fine-tune on: a stratified ``fraction`` of the labelled cells (Supp. F.1.1); the split is
    recorded in ``obs["cape_split"]`` ("fine_tune", "test", or "unused" for cells whose class is too small)."""
    if not 0 < fraction <= 1:
        raise CapeInputError(f"--fine-tune-fraction must be in (0, 1], got {fraction}")
    labels = checked_labels(adata, label_key)
    roles, _ = split_roles(adata, labels, seed=resolve_seed(None), fine_tune_fraction=fraction)
    record_split(adata, roles)
    return fine_tune_cells(adata, roles, labels, label_key)
