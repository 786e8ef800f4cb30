# `cape bench encodings` as a workflow target: one table per configs/benchmarks/<name>.yaml
#   snakemake --cores 2 --configfile configs/benchmarks/annotation_pbmc68k_reduced.yaml
BENCH = config["benchmark"]
for _key in ("task", "dataset"):
    if not BENCH.get(_key):
        raise WorkflowError(f"invalid config: benchmark.{_key} is required in a benchmark config")
BENCH_STEM = BENCH["name"] or f"{BENCH['task']}_{Path(BENCH['dataset']).stem}"
BENCH_OPTIONS = ("n_genes", "d_model", "n_layers", "max_len", "pretrain_epochs", "fine_tune_epochs",
                 "causal_epochs", "causal_tau", "embed_epochs", "embed_dim", "predictor_epochs")


def benchmark_outputs():
    """The table's JSON records, markdown and plot."""
    return [f"{BENCH['out']}/{BENCH_STEM}.{suffix}" for suffix in ("json", "md", "png")]


def benchmark_flags():
    """Command-line flags of `cape bench encodings` for the config's non-default options."""
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


rule bench_encodings:
    """Every positional encoding × backbone × seed on one task, with CAPE's ablations and the baselines."""
    output:
        json=f"{BENCH['out']}/{BENCH_STEM}.json",
        md=f"{BENCH['out']}/{BENCH_STEM}.md",
        png=f"{BENCH['out']}/{BENCH_STEM}.png",
    log:
        f"logs/bench/{BENCH_STEM}.log",
    benchmark:
        f"benchmarks/bench/{BENCH_STEM}.tsv"
    params:
        cape=CAPE,
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
        "{params.cape} --threads {threads} bench encodings --task {params.task} --dataset {params.dataset:q} --out {params.out:q}"
        " {params.flags} > {log:q} 2>&1"
