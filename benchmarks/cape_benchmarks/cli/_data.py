"""What ``cape-bench`` commands share: the ``--quick``/``--out`` options, and their data (a registered dataset, an
``.h5ad`` path or the perturbation simulation, with the label/batch keys from the dataset's manifest)."""

from __future__ import annotations

import argparse
from pathlib import Path

import anndata as ad

from cape import data
from cape._errors import CapeInputError
from cape.data.grn_cells import GRN_SIMULATIONS, simulate_grn_cells
from cape.data.perturbation_data import BENCHMARK_SIMULATIONS, CONTROL, sachs_interventions, simulate_perturbation
from cape.tasks.labels import manifest_key

#: Where every benchmark writes ``<name>.{json,md,png}`` unless ``--out`` says otherwise.
DEFAULT_OUT = "results/bench"


def add_run_options(parser: argparse.ArgumentParser, quick_help: str) -> None:
    """``--quick`` (a small smoke run, described by ``quick_help``) and ``--out`` (the output folder)."""
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder ({DEFAULT_OUT})")


def dataset_name(dataset: str) -> str:
    """The name records and output files carry: the file stem of an ``.h5ad``, else the dataset name."""
    return Path(dataset).stem if dataset.endswith(".h5ad") else dataset


#: The simulation of cell types and knock-outs on a known gene DAG (:func:`cape.data.grn_cells.simulate_grn_cells`):
#: every task runs on it, and CAPE on its true DAG is the oracle arm.
GRN_DATASET = "simulated_grn"


def grn_dataset(task: str, quick: bool) -> ad.AnnData:
    """The ``simulated_grn`` data (quick or full size): its control cells for annotation and clustering (labels
    ``cell_type``), every cell for perturbation."""
    adata = simulate_grn_cells(**GRN_SIMULATIONS["quick" if quick else "full"])
    if task != "perturbation":
        adata = adata[adata.obs["condition"] == CONTROL].copy()
    adata.uns.setdefault("cape", {})["dataset"] = {"name": GRN_DATASET, "keys": {"labels": "cell_type"}}
    return adata


def load_dataset(name: str, task: str, quick: bool = False) -> ad.AnnData | None:
    """A registered dataset, an ``.h5ad`` file or ``simulated_grn``; ``None`` for ``"simulated"`` (perturbation
    only)."""
    if name == "simulated":
        if task != "perturbation":
            raise CapeInputError("dataset 'simulated' is the perturbation simulation; use --task perturbation")
        return None
    if name == GRN_DATASET:
        return grn_dataset(task, quick)
    if name.endswith(".h5ad") or Path(name).exists():
        return data.read(name, expect_counts=False)
    return data.load(name)


def dataset_keys(adata: ad.AnnData, args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``--label-key`` / ``--batch-key``, else the dataset manifest's."""
    return (args.label_key or manifest_key(adata, "labels"),
            getattr(args, "batch_key", None) or manifest_key(adata, "batch"))


def perturbation_data(name: str, quick: bool, adata: ad.AnnData | None = None) -> ad.AnnData:
    """GEARS-format perturbation data: the benchmark simulation (quick or full) for ``"simulated"``, else the dataset
    (Sachs 2005 turned into its interventions)."""
    if adata is None:
        if name == "simulated":
            return simulate_perturbation(**BENCHMARK_SIMULATIONS["quick" if quick else "full"])
        adata = load_dataset(name, "perturbation", quick)
    if "observational" in adata.obs and "target" in adata.obs:  # Sachs 2005
        adata = sachs_interventions(adata)
    return adata
