"""Validation of the workflow configuration against ``configs/schema.yaml`` with one-line messages."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from ._errors import CapeInputError


def _key(path) -> str:
    return ".".join(str(p) for p in path)


def describe_error(err: jsonschema.ValidationError) -> str:
    """One line naming the offending config key."""
    where = _key(err.absolute_path)
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        prefix = f"{where}." if where else ""
        return (f"unknown config key {prefix + extra[0]!r} (misspelled?); allowed keys"
                f"{' in ' + where if where else ''}: {', '.join(allowed)}")
    if err.validator == "type":
        expected = err.validator_value if isinstance(err.validator_value, str) else " or ".join(err.validator_value)
        return f"config key {where!r} must be of type {expected}, got {err.instance!r}"
    if err.validator == "maxItems" and "description" in err.schema:
        return (f"config key {where!r} holds {len(err.instance)} items, at most {err.validator_value} here: "
                f"{err.schema['description']}")
    if err.validator == "pattern" and "description" in err.schema:  # a regular expression tells users little
        return f"config key {where!r} got {err.instance!r}: expected {err.schema['description']}"
    return f"config key {where or '(top level)'!r}: {err.message}"


def _load(schema: str | os.PathLike | Mapping[str, Any]) -> Mapping[str, Any]:
    return schema if isinstance(schema, Mapping) else yaml.safe_load(Path(schema).read_text())


_BOOLS = {"true": True, "false": False, "yes": True, "no": False}


def _coerce_scalar(value: str, types: list[str]) -> Any:
    for t in types:
        try:
            if t == "integer":
                return int(value)
            if t == "number":
                return float(value)
        except ValueError:
            continue
        if t == "boolean" and value.lower() in _BOOLS:
            return _BOOLS[value.lower()]
        if t == "null" and value.lower() in ("null", "none", "~"):
            return None
    return value


def coerce_config(config: dict[str, Any], schema: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    """Convert string values to the schema's scalar types, in place.

    ``snakemake --config section="{key: 3}"`` parses nested values as strings; a user means the number.
    Values that do not convert are left alone for :func:`validate_config` to report.
    """
    props = _load(schema).get("properties", {})
    for key, value in list(config.items()):
        sub = props.get(key)
        if sub is None:
            continue
        types = sub.get("type", [])
        types = [types] if isinstance(types, str) else list(types)
        if isinstance(value, dict) and "properties" in sub:
            coerce_config(value, sub)
        elif isinstance(value, str) and not _valid_string(value, sub, types):
            config[key] = _coerce_scalar(value, types)
    return config


def _valid_string(value: str, sub: Mapping[str, Any], types: list[str]) -> bool:
    """Whether ``value`` is meant as the string it is: the schema takes strings and this one fits their pattern and
    enum (``rank: auto`` stays a string, ``rank: 20`` and ``rank: None`` from ``--config`` do not)."""
    if "string" not in types:
        return False
    return (("pattern" not in sub or re.search(sub["pattern"], value) is not None)
            and ("enum" not in sub or value in sub["enum"]))


def validate_config(config: Mapping[str, Any], schema: str | os.PathLike | Mapping[str, Any]) -> None:
    """Raise :class:`cape.CapeInputError` with a one-line message for the first problem in ``config``."""
    schema = _load(schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(dict(config)), key=lambda e: (len(e.absolute_path), _key(e.absolute_path)))
    if errors:
        raise CapeInputError(describe_error(errors[0]))
    _check_rotary_fit(config, schema)


def _check_rotary_fit(config: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    """Step II's ``embed.dim`` × Step III's ``encode.bands`` angle coordinates must fit the ``train.d_model/2`` rotation
    planes of the encodings that read them (``cape``, ``tape``): fail before Steps I–II run, not at training."""
    props = schema.get("properties", {})

    def value(section: str, key: str) -> Any:
        given = config.get(section) or {}
        return given[key] if given.get(key) is not None else props[section]["properties"][key].get("default")

    if not {"train", "embed", "encode"} <= set(props) or value("train", "encoding") not in ("cape", "tape") \
            or value("train", "checkpoint"):
        return  # a checkpoint brings its own width
    bands = (config.get("train") or {}).get("encoding_options", {}).get("bands") or value("encode", "bands")
    dim, d_model = value("embed", "dim"), value("train", "d_model")
    if dim * bands > d_model // 2:
        raise CapeInputError(f"embed.dim {dim} × encode.bands {bands} = {dim * bands} angle coordinates exceed the "
                             f"train.d_model/2 = {d_model // 2} rotation planes: lower embed.dim or encode.bands")
