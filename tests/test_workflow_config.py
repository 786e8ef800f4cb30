"""Every `cape train` / `causal` / `embed` option is reachable from the workflow config and its command line."""

from __future__ import annotations

import argparse
import re

import pytest
import yaml
from _workflow import REPO, snakemake

SCHEMA = yaml.safe_load((REPO / "configs" / "schema.yaml").read_text())
CONFIG = yaml.safe_load((REPO / "configs" / "config.yaml").read_text())

#: CLI options set by the rule itself (paths) or by another config key, per command.
NOT_IN_SECTION = {
    "train": {"input": "rule input", "output": "rule output", "model_dir": "rule output",
              "label_key": "top-level `labels`", "encoding_option": "train.encoding_options"},
    "causal": {"input": "rule input", "output": "rule output"},
    "embed": {"input": "rule input", "output": "rule output", "adjacency": "API/CLI only: a user's own graph file"},
}


def _options(command: str) -> dict[str, argparse.Action]:
    from cape.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = commands.choices[command]
    return {a.dest: a for a in sub._actions if a.option_strings and a.dest != "help"}


@pytest.mark.parametrize("command", ["train", "causal", "embed"])
def test_every_cli_option_has_a_config_key(command):
    keys = set(SCHEMA["properties"][command]["properties"])
    options = _options(command)
    missing = sorted(set(options) - keys - set(NOT_IN_SECTION[command]))
    assert not missing, f"`cape {command}` options without a {command}.* config key: {missing}"
    # and the other way round: the train rule passes every train.* key as --key (cli_options in common.smk)
    if command == "train":
        assert not sorted(keys - set(options) - {"encoding_options"})
    assert "labels" in SCHEMA["properties"] and "encoding_options" in SCHEMA["properties"]["train"]["properties"]


@pytest.mark.parametrize("command", ["train", "causal", "embed"])
def test_schema_defaults_are_the_cli_defaults(command):
    schema = SCHEMA["properties"][command]["properties"]
    for dest, action in _options(command).items():
        if dest not in schema:
            continue
        default = schema[dest].get("default")
        cli = action.default
        if dest == "rank":  # null = dense in the config; the CLI spells it 'dense' and stores None
            assert (default, cli) == ("auto", "auto")
        elif action.const is True:  # store_true flags
            assert default is False and cli is False, dest
        else:
            assert default == cli, f"{command}.{dest}: schema default {default!r}, CLI default {cli!r}"
    assert set(schema) <= set(CONFIG[command]), "configs/config.yaml should list every key"


def test_config_reaches_the_command_lines(workdir):
    (workdir / "scgpt_ckpt").mkdir()
    proc = snakemake(workdir, "-n", "-p", "--cores", "2", "--config", "device=cuda",
                     "train={'checkpoint': 'scgpt_ckpt', 'dropout': 0.1, 'pooling': 'cls', 'use_raw': True, "
                     "'encoding_options': {'scale': 0.5}}",
                     "causal={'h_every': 7, 'max_steps': None, 'interventions': 'condition', "
                     "'leave_out_targets': False}",
                     "preprocess={'transpose': True}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    commands = {line.split(" -m cape ", 1)[1].split(" --input")[0].split()[-1]: line
                for line in proc.stdout.splitlines() if " -m cape " in line}
    assert set(commands) == {"preprocess", "causal", "embed", "encode", "train", "evaluate"}
    train = commands["train"]
    for flag in ("--checkpoint scgpt_ckpt", "--dropout 0.1", "--pooling cls", "--use-raw",
                 "--encoding-option scale=0.5", "--fit-patience 15", "--early-stopping-metric val_loss"):
        assert flag in train, flag
    assert "--fit-lr 0.0003" in train and "--max-len auto" in train and "--cell-weight 1.0" in train
    assert "--layer" not in train  # null keeps the CLI default
    assert "--h-every 7" in commands["causal"] and "--layer" not in commands["causal"]
    assert "--max-steps none" in commands["causal"]
    assert "--interventions condition --no-leave-out-targets" in commands["causal"]
    assert " --interventions condition " in commands["preprocess"]  # the targets join the HVGs
    assert " --transpose " in commands["preprocess"]
    assert "orient-by-shifts" not in commands["causal"]  # true keeps the CLI default
    for name, line in commands.items():  # every rule passes its {threads}
        assert "--device cuda --threads " in line, name
    gpus = [line for line in proc.stdout.splitlines() if line.strip().startswith("resources:") and "gpu=" in line]
    assert len(gpus) == 6 and all("gpu=1" in line for line in gpus)
    cpu = snakemake(workdir, "-n", "-p", "--cores", "2")
    assert cpu.returncode == 0 and "gpu=1" not in cpu.stdout and "gpu=0" in cpu.stdout
    assert "--interventions" not in cpu.stdout  # causal.interventions null: no labels anywhere
    assert "--transpose" not in cpu.stdout


@pytest.mark.parametrize(
    "section, value, words",
    [
        ("train", {"pooling": "max"}, "config key 'train.pooling'"),
        ("train", {"fit_patience": "many"}, "config key 'train.fit_patience' must be of type integer"),
        ("train", {"class_wieght": "none"}, "unknown config key 'train.class_wieght'"),
        ("train", {"warmup_fraction": "1.5"}, "config key 'train.warmup_fraction'"),
        ("causal", {"h_evry": "3"}, "unknown config key 'causal.h_evry'"),
        ("causal", {"tau": "budgte"}, "config key 'causal.tau' got 'budgte': expected edge threshold τ in [0, 1), "
                                      "or a rule. budget:"),
        ("causal", {"h_every": "0"}, "config key 'causal.h_every'"),
        ("embed", {"dimm": "3"}, "unknown config key 'embed.dimm'"),
        ("encode", {"scael": "1"}, "unknown config key 'encode.scael'"),
        ("encode", {"bands": "4"}, "embed.dim 32 × encode.bands 4 = 128 angle coordinates exceed the "
                                   "train.d_model/2 = 32 rotation planes"),
        ("encode", {"bands": "0"}, "config key 'encode.bands'"),
        ("predict", {"intervene": ["GATA1=0", "SPI1=0"], "equations": "equivalence_class"},
         "config key 'predict.intervene' holds 2 items, at most 1 here: equations: equivalence_class predicts one"),
    ],
)
def test_nested_config_errors_name_the_key(section, value, words):
    """What common.smk runs on the config (strings as from `--config`), in-process."""
    from cape import CapeInputError
    from cape.workflow_config import coerce_config, validate_config

    config = {**CONFIG, section: {**CONFIG[section], **value}}
    with pytest.raises(CapeInputError, match="^" + re.escape(words)):
        coerce_config(config, SCHEMA)
        validate_config(config, SCHEMA)
    assert coerce_config({**CONFIG}, SCHEMA) is not None
    validate_config(CONFIG, SCHEMA)  # the shipped config is valid


def test_bands_that_fit_the_model_pass_the_config_check():
    from cape.workflow_config import validate_config

    validate_config({**CONFIG, "embed": {**CONFIG["embed"], "dim": 8}, "encode": {**CONFIG["encode"], "bands": 4}},
                    SCHEMA)
    validate_config({**CONFIG, "encode": {**CONFIG["encode"], "bands": 4},  # a checkpoint brings its own width
                     "train": {**CONFIG["train"], "checkpoint": "ckpt"}}, SCHEMA)
