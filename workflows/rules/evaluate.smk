# Snakemake's HTML report (`snakemake --report report.html`): the global description, then the items marked report()
report: "../report/workflow.rst"


# Earlier stages whose Snakemake benchmark files (time, peak memory) the report's verdict reads
MEASURED_STAGES = ["preprocess", "causal", "embed", "encode", "train"]
# Sections of the HTML report for the files in report_figures/ (Snakemake sorts sections by name)
REPORT_SECTIONS = {"verdict": "1. Verdict", "dag": "2. Genes", "poincare": "2. Genes", "cells": "3. Cells",
                   "metrics": "4. Metrics"}


rule evaluate:
    """Annotation and clustering metrics beside baselines, and the run's report with the DAG and the Poincaré disk."""
    input:
        h5ad="results/{dataset}/trained.h5ad",
        model="results/{dataset}/model",
        benchmarks=expand("logs/{{dataset}}/{stage}.tsv", stage=MEASURED_STAGES),
    output:
        metrics=report("results/{dataset}/metrics.json", caption="../report/metrics_json.rst",
                       category="4. Metrics", labels={"run": "{dataset}", "item": "metrics.json"}),
        report="results/{dataset}/report.md",
        figures=report(directory("results/{dataset}/report_figures"), patterns=["{name}.png", "{name}.html"],
                       caption="../report/evaluate.rst",
                       category=lambda wildcards: REPORT_SECTIONS.get(wildcards.name, "5. Other"),
                       labels={"run": "{dataset}", "item": "{name}"}),
    log:
        "logs/{dataset}/evaluate.log",
    benchmark:
        "logs/{dataset}/evaluate.tsv"
    params:
        cape=CAPE,
        labels=config["labels"] or "none",
        benchmarks=lambda wildcards: f"logs/{wildcards.dataset}",
    threads: 1
    resources:
        mem_mb=2000,  # max_rss 0.87 GB on 5,000 cells × 33,000 genes
        runtime=30,
        gpu=gpus(),
    shell:
        "{params.cape} --threads {threads} evaluate --input {input.h5ad:q} --model {input.model:q} --metrics {output.metrics:q} --report {output.report:q}"
        " --label-key {params.labels} --name {wildcards.dataset} --benchmarks {params.benchmarks:q}"
        f"{LOG}"
