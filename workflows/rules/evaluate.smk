rule evaluate:
    """Annotation and clustering metrics beside baselines, and the run's report with the DAG and the Poincaré disk."""
    input:
        h5ad="results/{dataset}/trained.h5ad",
        model="results/{dataset}/model",
    output:
        metrics="results/{dataset}/metrics.json",
        report="results/{dataset}/report.md",
    log:
        "logs/{dataset}/evaluate.log",
    benchmark:
        "benchmarks/{dataset}/evaluate.tsv"
    params:
        cape=CAPE,
        labels=config["labels"] or "none",
    threads: 1
    resources:
        mem_mb=2000,  # max_rss 0.87 GB on 5,000 cells × 33,000 genes
        runtime=30,
        gpu=0,
    shell:
        "{params.cape} evaluate --input {input.h5ad:q} --model {input.model:q} --metrics {output.metrics:q} --report {output.report:q}"
        " --label-key {params.labels} --name {wildcards.dataset}"
        " > {log:q} 2>&1"
