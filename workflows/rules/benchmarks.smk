# `cape-bench encodings` as a workflow target: one table per configs/benchmarks/<name>.yaml
#   snakemake --cores 2 --configfile configs/benchmarks/annotation_pbmc68k_reduced.yaml
BENCH = config["benchmark"]
for _key in ("task", "dataset"):
    if not BENCH.get(_key):
        raise WorkflowError(f"invalid config: benchmark.{_key} is required in a benchmark config")
BENCH_STEM = BENCH["name"] or f"{BENCH['task']}_{Path(BENCH['dataset']).stem}"
BENCH_OPTIONS = ("n_genes", "d_model", "n_layers", "n_heads", "max_len", "batch_size", "lr", "pretrain_epochs",
                 "annotation_pretrain_epochs", "fine_tune_epochs", "causal_epochs", "causal_tau", "embed_epochs",
                 "embed_dim", "bands", "band_top", "predictor_epochs")
# task gears runs `cape-bench gears`: Steps I-III options, GEARS' own; the transformer's are not its business
GEARS_OPTIONS = ("n_genes", "causal_epochs", "causal_tau", "embed_epochs", "embed_dim")
GEARS_ONLY = ("go_graph", "gears_epochs", "arms")
GEARS_GO = "resources/gears/gene2go_all.pkl"  # GEARS' gene → GO terms pickle, fetched by rule gears_gene2go
GEARS_GO_URL = "https://dataverse.harvard.edu/api/access/datafile/6153417"
GEARS = BENCH["task"] == "gears"
_misplaced = ([k for k in BENCH_OPTIONS if k not in GEARS_OPTIONS and BENCH.get(k) is not None] if GEARS
              else [k for k in GEARS_ONLY if BENCH.get(k) is not None])
if _misplaced:
    raise WorkflowError(f"invalid config: benchmark.{_misplaced[0]} does not apply to task {BENCH['task']}")


def benchmark_outputs():
    """The table's JSON records, markdown and plot."""
    return [f"{BENCH['out']}/{BENCH_STEM}.{suffix}" for suffix in ("json", "md", "png")]


def benchmark_flags():
    """Command-line flags of `cape-bench encodings` for the config's non-default options."""
    flags = [f"--seeds {' '.join(map(str, BENCH['seeds']))}", f"--backbones {' '.join(BENCH['backbones'])}",
             f"--integrations {' '.join(BENCH['integrations'])}",
             f"--threads {BENCH['threads']}", f"--jobs {BENCH['jobs']}", f"--name {BENCH_STEM}"]
    if BENCH["encodings"]:
        flags.append(f"--encodings {' '.join(BENCH['encodings'])}")
    if BENCH["label_key"]:
        flags.append(f"--label-key {BENCH['label_key']}")
    if BENCH["quick"]:
        flags.append("--quick")
    flags += [f"--{k.replace('_', '-')} {BENCH[k]}" for k in BENCH_OPTIONS if BENCH.get(k) is not None]
    return " ".join(flags)


def gears_flags():
    """Command-line flags of `cape-bench gears` for the config's non-default options."""
    flags = [f"--seeds {' '.join(map(str, BENCH['seeds']))}", f"--threads {BENCH['threads']}", f"--name {BENCH_STEM}"]
    if BENCH["arms"]:
        flags.append(f"--arms {' '.join(BENCH['arms'])}")
    if BENCH["go_graph"]:
        flags.append(f"--go-graph {shlex.quote(BENCH['go_graph'])}")
    if BENCH["gears_epochs"]:
        flags.append(f"--epochs {BENCH['gears_epochs']}")
    if BENCH["quick"]:
        flags.append("--quick")
    flags += [f"--{k.replace('_', '-')} {BENCH[k]}" for k in GEARS_OPTIONS if BENCH.get(k) is not None]
    return " ".join(flags)


def gears_go_file(wildcards):
    """The GO file as the rule's input (so the workflow fetches GEARS' own when asked), none for built-in graphs."""
    go = BENCH["go_graph"] or ""
    return [go] if go.endswith((".pkl", ".csv")) else []


if GEARS:

    rule gears_gene2go:
        """GEARS' gene → GO-terms pickle from Harvard Dataverse (needs the internet; GEARS downloads the same file)."""
        output:
            GEARS_GO,
        log:
            "logs/bench/gears_gene2go.log",
        params:
            python=sys.executable,
            url=GEARS_GO_URL,
        shell:
            "{params.python:q} -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])'"
            " {params.url:q} {output:q} " f"{LOG}"


    rule bench_gears:
        """GEARS plain vs GEARS fed CAPE's gene positions (and PCA / random controls) on one perturbation dataset."""
        input:
            gears_go_file,
        output:
            json=f"{BENCH['out']}/{BENCH_STEM}.json",
            md=f"{BENCH['out']}/{BENCH_STEM}.md",
            png=f"{BENCH['out']}/{BENCH_STEM}.png",
        log:
            f"logs/bench/{BENCH_STEM}.log",
        benchmark:
            f"logs/bench/{BENCH_STEM}.tsv"
        params:
            cape_bench=CAPE_BENCH,
            dataset=BENCH["dataset"],
            out=lambda wildcards, output: str(Path(output.json).parent),
            flags=gears_flags(),
        threads: BENCH["threads"]
        resources:
            mem_mb=16000,
            runtime=BENCH["runtime"],
            gpu=gpus(),
        shell:
            "{params.cape_bench} --threads {threads} gears --dataset {params.dataset:q} --out {params.out:q}"
            " {params.flags} " f"{LOG}"

else:

    rule bench_encodings:
        """Every positional encoding × backbone × seed on one task, with CAPE's ablations and the baselines."""
        output:
            json=f"{BENCH['out']}/{BENCH_STEM}.json",
            md=f"{BENCH['out']}/{BENCH_STEM}.md",
            png=f"{BENCH['out']}/{BENCH_STEM}.png",
        log:
            f"logs/bench/{BENCH_STEM}.log",
        benchmark:
            f"logs/bench/{BENCH_STEM}.tsv"
        params:
            cape_bench=CAPE_BENCH,
            task=BENCH["task"],
            dataset=BENCH["dataset"],
            out=lambda wildcards, output: str(Path(output.json).parent),
            flags=benchmark_flags(),
        threads: BENCH["jobs"] * BENCH["threads"]
        resources:
            mem_mb=8000,
            runtime=BENCH["runtime"],
            gpu=gpus(),
        shell:
            "{params.cape_bench} --threads {threads} encodings --task {params.task} --dataset {params.dataset:q} --out {params.out:q}"
            " {params.flags} " f"{LOG}"
