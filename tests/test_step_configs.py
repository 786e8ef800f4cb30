"""Step I and II options (CausalConfig, NotearsConfig, EmbeddingConfig): validation, the workflow schema's keys and
defaults, the CLI flags, keyword overrides of the API, and records under ``key_added``."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp
import yaml
from _workflow import REPO

import cape
from cape import CapeInputError
from cape.causal import CausalConfig, NotearsConfig, fit_variational_notears
from cape.hyperbolic import EmbeddingConfig, embed_dag
from cape.tl._causal_graph import DATA_KEYS

SCHEMA = yaml.safe_load((REPO / "configs" / "schema.yaml").read_text())["properties"]


def _fields(cls) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("section, cls, data_keys", [("causal", CausalConfig, set(DATA_KEYS)),
                                                     ("embed", EmbeddingConfig, set())])
def test_schema_keys_and_defaults_are_the_config_fields(section, cls, data_keys):
    schema = SCHEMA[section]["properties"]
    assert set(schema) == set(_fields(cls)) | data_keys
    for name, default in _fields(cls).items():
        assert schema[name].get("default") == default, f"{section}.{name}"
    cls(**{name: schema[name]["default"] for name in _fields(cls)})  # the schema's defaults pass validation


@pytest.mark.parametrize("command, cls", [("causal", CausalConfig), ("embed", EmbeddingConfig)])
def test_cli_defaults_build_the_default_config(command, cls):
    from cape.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    args = sub.parse_args(["--input", "in.h5ad", "--output", "out.h5ad"])
    module = __import__(f"cape.cli.{command}_command", fromlist=["config_from_args"])
    assert module.config_from_args(args) == cls()


@pytest.mark.parametrize("cls, field, value", [
    (CausalConfig, "model", "lingam"), (CausalConfig, "rank", 0), (CausalConfig, "rank", "low"),
    (CausalConfig, "rank", True), (CausalConfig, "tau", 1.0), (CausalConfig, "tau", "often"),
    (CausalConfig, "min_positioned", 1.5), (CausalConfig, "lambda_sparse", -1.0), (CausalConfig, "epochs", 0),
    (CausalConfig, "batch_size", 2.5), (CausalConfig, "lr", 0.0), (CausalConfig, "h_every", 0),
    (CausalConfig, "screen", "lasso"), (CausalConfig, "budget_fdr", 0.0), (CausalConfig, "budget_fdr", 1.0),
    (CausalConfig, "budget_fill_fdr", 0.0), (CausalConfig, "budget_fill_fdr", "loose"),
    (CausalConfig, "budget_cells", 0), (CausalConfig, "budget_cells", 2.5), (CausalConfig, "max_steps", 0),
    (NotearsConfig, "max_steps", 2.5), (NotearsConfig, "max_steps", "fast"),
    (NotearsConfig, "rank", 0), (NotearsConfig, "rho_max", float("inf")), (NotearsConfig, "h_every", 2.5),
    (NotearsConfig, "recon_fraction", 0.0), (NotearsConfig, "feature_norm", "global"),
    (NotearsConfig, "standardize", "global"), (NotearsConfig, "hidden", -1),
    (EmbeddingConfig, "dim", 1), (EmbeddingConfig, "k_hop", 0), (EmbeddingConfig, "restart", 1.0),
    (EmbeddingConfig, "epochs", -1), (EmbeddingConfig, "lr", 0.0), (EmbeddingConfig, "optimizer", "lbfgs"),
    (EmbeddingConfig, "geometry", "spherical"), (EmbeddingConfig, "negatives", 0),
    (EmbeddingConfig, "max_radius", 0.0), (EmbeddingConfig, "temperature", float("nan")),
    (EmbeddingConfig, "isolated", "drop"), (EmbeddingConfig, "positive_weights", "degree"),
])
def test_bad_values_are_one_line_errors_naming_the_field(cls, field, value):
    with pytest.raises(CapeInputError, match=field) as err:
        cls(**{field: value})
    assert "\n" not in str(err.value)


def test_configs_are_frozen_and_normalise_their_values():
    config = CausalConfig(tau=" Budget ")
    assert config.tau == "budget" and CausalConfig(tau=0).tau == 0.0
    assert EmbeddingConfig(temperature=None).temperature == EmbeddingConfig().temperature == 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epochs = 3


def test_causal_config_resolves_rank_and_lambda_per_gene_count():
    auto = CausalConfig()
    assert auto.rank_for(300) is None and auto.rank_for(1001) == 40 and auto.lambda_for(None) == 0.3
    assert CausalConfig(model="paper").rank_for(300) == 40 and CausalConfig(model="paper").lambda_for(40) == 1.0
    assert CausalConfig(rank=50).rank_for(30) is None  # r ≥ genes: dense
    assert CausalConfig(model="parents_mlp").rank_for(5000) is None
    # Screened candidate parents keep A dense at any size; only without them does rank 40 take over.
    assert auto.rank_for(2000, screened=True) is None and auto.notears_options(2000, screened=True)["rank"] is None
    assert auto.notears_options(2000)["rank"] == 40 and CausalConfig(model="paper").rank_for(2000, screened=True) == 40
    with pytest.raises(CapeInputError, match="sparse must be"):
        NotearsConfig(sparse="yes")
    options = CausalConfig(epochs=7, lambda_sparse=2.0).notears_options(20)
    assert options == {"rank": None, "lambda_sparse": 2.0, "epochs": 7, "max_steps": "auto", "batch_size": 128,
                       "lr": 3e-3, "h_every": None}
    NotearsConfig(**options)


def _adata(n_cells: int = 80, n_genes: int = 5) -> ad.AnnData:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n_cells, n_genes)).astype(np.float32)
    X[:, 1] += 2.0 * X[:, 0]
    X[:, 2] += 1.5 * X[:, 1]
    adata = ad.AnnData(X)
    adata.var_names = [f"g{i}" for i in range(n_genes)]
    return adata


QUICK = {"epochs": 3, "tau": 0.05, "min_positioned": 0.0}


def test_config_and_keyword_overrides_give_the_same_graph():
    by_keywords = cape.tl.causal_graph(_adata(), copy=True, use_genes=None, rank=None, **QUICK)
    by_config = cape.tl.causal_graph(_adata(), CausalConfig(rank=None, **QUICK), copy=True, use_genes=None)
    mixed = cape.tl.causal_graph(_adata(), CausalConfig(rank=None, epochs=50), copy=True, use_genes=None, **QUICK)
    for other in (by_config, mixed):
        assert (by_keywords.varp["cape_dag"] != other.varp["cape_dag"]).nnz == 0
        assert by_keywords.uns["cape"]["causal_graph"]["params"] == other.uns["cape"]["causal_graph"]["params"]


@pytest.mark.parametrize("call", [
    lambda: cape.tl.causal_graph(_adata(), rnak=3),
    lambda: cape.tl.hyperbolic_embedding(_adata(), dimm=3),
    lambda: fit_variational_notears(np.zeros((20, 3), np.float32), lamda_sparse=1.0),
    lambda: embed_dag(np.zeros((3, 3)), epoch=3),
])
def test_unknown_options_are_one_line_errors_with_a_suggestion(call):
    with pytest.raises(CapeInputError, match=r"unknown option '\w+' \(did you mean '\w+'\?\)"):
        call()


def test_a_config_of_the_wrong_class_is_refused():
    with pytest.raises(CapeInputError, match="config must be a CausalConfig, got EmbeddingConfig"):
        cape.tl.causal_graph(_adata(), EmbeddingConfig())


def test_records_follow_key_added():
    adata = _adata()
    cape.tl.causal_graph(adata, use_genes=None, rank=None, **QUICK)
    cape.tl.causal_graph(adata, use_genes=None, rank=None, key_added="dag_tau02", **{**QUICK, "tau": 0.2})
    records = adata.uns["cape"]
    assert records["causal_graph"]["params"]["key_added"] == "cape_dag" and records["causal_graph"]["tau_used"] == 0.05
    assert records["dag_tau02"]["params"]["key_added"] == "dag_tau02" and records["dag_tau02"]["tau_used"] == 0.2
    assert {"cape_dag", "dag_tau02"} <= set(adata.varp)
    # Step II/III on the second graph; Step III's record under its own key too.
    cape.tl.hyperbolic_embedding(adata, dag_key="dag_tau02", dim=2, epochs=3, temperature=1.0)
    assert adata.uns["cape"]["hyperbolic_embedding"]["params"]["source"] == "varp['dag_tau02']"
    cape.tl.rotary_encoding(adata)
    cape.tl.rotary_encoding(adata, scale=0.5, key_added="angles_half")
    assert records["rotary_encoding"]["params"]["scale"] == pytest.approx(np.pi / 4)
    assert records["angles_half"]["params"]["scale"] == 0.5
    from cape.models.positions import angle_record

    assert angle_record(adata, "angles_half")["scale"] == 0.5
    assert angle_record(adata)["scale"] == pytest.approx(np.pi / 4)


def test_learned_equations_are_read_for_the_graph_asked_for():
    from cape.tl._predict_intervention import load_equations

    adata = _adata()
    cape.tl.causal_graph(adata, use_genes=None, rank=None, **QUICK)
    cape.tl.causal_graph(adata, use_genes=["g0", "g1", "g2"], rank=None, key_added="dag3", **QUICK)
    assert len(load_equations(adata)["genes"]) == 5
    assert len(load_equations(adata, "dag3")["genes"]) == 3
    adata.varp["true_dag"] = sp.csr_matrix((5, 5))
    assert len(load_equations(adata, "true_dag")["genes"]) == 5  # no Step I record of its own: the default's


@pytest.mark.parametrize("function", [cape.tl.causal_graph, cape.tl.hyperbolic_embedding, fit_variational_notears,
                                      embed_dag])
def test_step_functions_take_at_most_twelve_parameters(function):
    assert len(inspect.signature(function).parameters) <= 12
