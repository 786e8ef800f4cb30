"""Datasets and readers: ``read`` a user's file, ``load`` a named dataset from ``data_manifests/``."""

from __future__ import annotations

from .download import cache_dir
from .expression import simulate_expression  # 10x-shaped UMI or TPM matrices
from .gaussian_bn import GaussianBN, read_gaussian_bn  # bnlearn linear Gaussian networks (ecoli70, arth150)
from .grn_cells import CountNoise, simulate_grn_cells  # cell types and knock-outs on a known gene DAG, as counts
from .manifest import Manifest, get_manifest, manifest_dir, manifests, read_manifest
from .perturbation_data import sachs_interventions, simulate_perturbation  # GEARS-format perturbation data
from .registry import available, fetch, load
from .simulate import simulate_sem  # gcastle SEM simulator; castle.datasets imported on call, quietly
from .user_files import read, validate_adata

__all__ = [
    "CountNoise",
    "GaussianBN",
    "Manifest",
    "available",
    "cache_dir",
    "fetch",
    "get_manifest",
    "load",
    "manifest_dir",
    "manifests",
    "read",
    "read_gaussian_bn",
    "read_manifest",
    "sachs_interventions",
    "simulate_expression",
    "simulate_grn_cells",
    "simulate_perturbation",
    "simulate_sem",
    "validate_adata",
]
