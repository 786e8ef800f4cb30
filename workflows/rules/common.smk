# Shared definitions: config validation (with schema defaults), the run name and the cape command.
import json
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from cape import CapeInputError
from cape.data.user_files import check_obs_columns, check_suffix
from cape.workflow_config import coerce_config, validate_config

# cape's check first: one line naming the offending key; then Snakemake's, which fills in the schema defaults.
# Nested --config overrides arrive as strings; coerce them to the schema's types first.
SCHEMA = workflow.source_path("../../configs/schema.yaml")
try:
    coerce_config(config, SCHEMA)
    validate_config(config, SCHEMA)
except CapeInputError as err:
    raise WorkflowError(f"invalid config: {err}") from None
validate(config, schema="../../configs/schema.yaml", set_default=True)
if config["input"] and not Path(config["input"]).exists():
    raise WorkflowError(f"input file not found: {config['input']}")
if config["input"]:
    # what would otherwise fail only after Step I: an unreadable file type, a label or perturbation column it lacks
    obs_keys = {"labels": None if config["perturbations"] else config["labels"],
                "causal.interventions": config["causal"].get("interventions"), "perturbations": config["perturbations"]}
    try:
        check_suffix(config["input"])
        check_obs_columns(config["input"], {k: v for k, v in obs_keys.items() if v and v not in ("auto", "none")})
    except CapeInputError as err:
        raise WorkflowError(str(err)) from None
if config["train"]["checkpoint"] and not Path(config["train"]["checkpoint"]).is_dir():
    raise WorkflowError(f"train.checkpoint folder not found: {config['train']['checkpoint']}")

# The CLI of the Python running Snakemake, so rules use the same installation (also on cluster nodes
# that share the file system).
CAPE = f'"{sys.executable}" -m cape --seed {config["seed"]} --device {config["device"]}'
# The benchmarks' command line (benchmarks/cape_benchmarks, installed with cape), for configs/benchmarks/*.yaml
CAPE_BENCH = f'"{sys.executable}" -m cape_benchmarks --seed {config["seed"]} --device {config["device"]}'
# Ends each rule's shell command: the log keeps everything, and a user mistake's one-line "cape: error: ..." is
# repeated on the terminal, where Snakemake otherwise shows only that the job failed.
LOG = " > {log:q} 2>&1 || {{ grep -h '^cape: error:' {log:q} >&2; exit 1; }}"

if config["input"]:
    RUN = config["name"] or Path(config["input"]).stem
else:
    RUN = config["name"] or config["dataset"]


def gpus():
    """GPUs each job requests from a scheduler (resources.gpu), 1 when the config's device is cuda or cuda:N, else 0."""
    return 1 if str(config["device"]).startswith("cuda") else 0


def cli_options(section, skip=()):
    """`--key value` for every key of config[section] (schema key = CLI option with '-' for '_'), in config order.

    null leaves the CLI default; true/false switch a flag on/off; a mapping (train.encoding_options) gives
    one `--encoding-option KEY=VALUE` per entry (VALUE as JSON).
    """
    flags = []
    for key, value in config[section].items():
        if key in skip or value is None or value is False:
            continue
        option = f"--{key.replace('_', '-')}"
        if value is True:
            flags.append(option)
        elif isinstance(value, dict):
            singular = option.removesuffix("s")
            # strings go as typed (--config makes nested values strings; the CLI parses JSON where it can)
            flags += [f"{singular} {shlex.quote(f'{k}={v if isinstance(v, str) else json.dumps(v)}')}"
                      for k, v in value.items()]
        else:
            flags.append(f"{option} {shlex.quote(str(value))}")
    return " ".join(flags)


def interventions_flag():
    """`--interventions KEY` of `cape preprocess` and `cape causal` (causal.interventions; for preprocessing in the
    perturbation mode the perturbations column, whose targets must all be kept), or nothing."""
    key = config["causal"].get("interventions") or config["perturbations"]
    return f"--interventions {shlex.quote(str(key))}" if key else ""


def input_spec():
    """What `cape preprocess --input` reads: the user's file, or `dataset:NAME`."""
    return config["input"] if config["input"] else f"dataset:{config['dataset']}"


def input_files(wildcards):
    """Snakemake input of the first rule: the user's file (so edits trigger reruns), nothing for datasets."""
    return [config["input"]] if config["input"] else []


def perturbation_item(name):
    """An output of `cape perturb`, shown in Snakemake's HTML report (`snakemake --report report.html`)."""
    return report(f"results/{{dataset}}/perturbation/{name}", caption="../report/perturb.rst",
                  category="Perturbation prediction", labels={"run": "{dataset}", "item": name})


PERTURBATION_OUTPUTS = ("metrics.json", "per_perturbation.tsv", "split.tsv", "report.md", "shifts.png")


def final_outputs():
    """Final targets of the workflow: the last stage of the pipeline for this run (and predictions when asked); in
    the perturbation mode (config perturbations), the perturbation outputs instead."""
    if config["perturbations"]:
        return [f"results/{RUN}/perturbation/{name}" for name in PERTURBATION_OUTPUTS]
    predictions = [f"results/{RUN}/predict/shifts.tsv"] if config["predict"]["intervene"] else []
    return [f"results/{RUN}/report.md", f"results/{RUN}/metrics.json", *predictions]
