from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cape import CapeInputError
from cape.workflow_config import coerce_config, validate_config

SCHEMA = Path(__file__).resolve().parent.parent / "configs" / "schema.yaml"


def test_default_config_is_valid():
    config = yaml.safe_load((SCHEMA.parent / "config.yaml").read_text())
    validate_config(config, SCHEMA)


def test_nested_strings_are_coerced():
    config = {"seed": "3", "preprocess": {"min_genes": "10", "target_sum": "1e4", "log1p": "false"}, "input": "null"}
    coerce_config(config, SCHEMA)
    assert config == {"seed": 3, "preprocess": {"min_genes": 10, "target_sum": 1e4, "log1p": False}, "input": "null"}
    validate_config(config, SCHEMA)


def test_strings_of_keys_that_also_take_words_are_coerced_unless_they_are_the_word():
    # `--config causal="{rank: 20, max_steps: None}"` arrives as strings; "auto" is meant as the word
    config = {"causal": {"rank": "20", "max_steps": "None", "h_every": "7"}}
    coerce_config(config, SCHEMA)
    assert config == {"causal": {"rank": 20, "max_steps": None, "h_every": 7}}
    config = {"causal": {"rank": "auto", "max_steps": "auto"}}
    coerce_config(config, SCHEMA)
    assert config == {"causal": {"rank": "auto", "max_steps": "auto"}}
    validate_config(config, SCHEMA)
    bad = {"causal": {"max_steps": "fast"}}
    coerce_config(bad, SCHEMA)
    with pytest.raises(CapeInputError, match="causal.max_steps"):
        validate_config(bad, SCHEMA)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"sed": 1}, "unknown config key 'sed' (misspelled?); allowed keys: benchmark, causal, dataset, device"),
        ({"preprocess": {"n_top": 5}}, "unknown config key 'preprocess.n_top'"),
        ({"preprocess": {"min_genes": "many"}}, "config key 'preprocess.min_genes' must be of type integer"),
        ({"device": "gpu"}, "config key 'device'"),
    ],
)
def test_messages_name_the_key(config, message):
    coerce_config(config, SCHEMA)
    with pytest.raises(CapeInputError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        validate_config(config, SCHEMA)
