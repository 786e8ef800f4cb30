"""When does pretraining give the ``<cls>`` state its cell structure? Per pretraining epoch, the validation loss
and the ARI of k-means on the ``<cls>`` embedding against the labels: the curves that say whether a stop rule on
the validation loss would stop before the cells separate (docs/benchmarks/recipe.md, issue 55).

``python -m cape_benchmarks.cli.pretrain_structure --dataset simulated_grn --seed 3 --out results/bench`` runs the
recipe benchmark's model (scGPT, ``trainable_absolute``, the default recipe's pretraining, every epoch) on the recipe
benchmark's data (``pbmc68k_reduced``, ``simulated_grn``, or an .h5ad of raw counts with ``obs["cell_type"]``,
preprocessed as the workflow does) and writes ``pretrain_structure_<dataset>_<seed>.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cape.models import CellTransformer
from cape.models.hyperparameters import DEFAULT_RECIPE
from cape.models.training import engine
from cape.tasks.clustering import clustering_metrics, kmeans_clusters
from cape.tasks.labels import checked_labels

from ..recipe import ModelShape


def structure_curve(adata, label_key: str, seed: int, epochs: int = DEFAULT_RECIPE.pretrain_epochs) -> list[dict]:
    """The pretraining history with ``ari`` (k-means on the ``<cls>`` embedding of the labelled cells, read after
    each epoch) added to every epoch's record."""
    labels = checked_labels(adata, label_key)
    y, k, cells = labels.to_numpy(), labels.nunique(), adata[labels.index]
    shape = ModelShape()
    model = CellTransformer(adata, shape.architecture, shape.encoding, d_model=shape.d_model,
                            n_layers=shape.n_layers, n_heads=shape.n_heads, max_len=DEFAULT_RECIPE.max_len,
                            dropout=DEFAULT_RECIPE.dropout, seed=seed, device="cpu")
    epoch_of = engine.Trainer._epoch

    def scored_epoch(trainer, task, *args):
        record = epoch_of(trainer, task, *args)
        embedding = model.get_latent_representation(cells, pooling="cls")
        record["ari"] = clustering_metrics(embedding, y, kmeans_clusters(embedding, k, seed=seed))["ARI"]
        task.train()
        return record

    engine.Trainer._epoch = scored_epoch
    try:
        return model.pretrain(adata, epochs=epochs, lr=DEFAULT_RECIPE.pretrain_lr,
                              cell_weight=DEFAULT_RECIPE.cell_weight, batch_size=DEFAULT_RECIPE.batch_size,
                              early_stopping_patience=None)
    finally:
        engine.Trainer._epoch = epoch_of


def main(argv: list[str] | None = None) -> int:
    from cape import data, pp

    from .recipe_command import PREPROCESS, load

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="simulated_grn")
    parser.add_argument("--label-key", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/bench")
    args = parser.parse_args(argv)
    if args.dataset.endswith(".h5ad"):
        adata = data.read(args.dataset)
        pp.preprocess(adata, n_top_genes=PREPROCESS["n_top_genes"])
    else:
        adata = load(args.dataset)
    key = args.label_key or ("bulk_labels" if "bulk_labels" in adata.obs else "cell_type")
    start = time.perf_counter()
    history = structure_curve(adata, key, args.seed)
    name = Path(args.dataset).stem
    out = Path(args.out) / f"pretrain_structure_{name}_{args.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seconds": time.perf_counter() - start, "history": history}, indent=1))
    for record in history:
        print(record["epoch"], f"{record['val_loss']:.5f}", f"{record['ari']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
