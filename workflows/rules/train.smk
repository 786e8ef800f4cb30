rule train:
    """Pretrain (masked values) and fine-tune a transformer with the CAPE encoding; cell embeddings → obsm['X_cape']."""
    input:
        "results/{dataset}/encoded.h5ad",
    output:
        h5ad="results/{dataset}/trained.h5ad",
        model=directory("results/{dataset}/model"),
    log:
        "logs/{dataset}/train.log",
    benchmark:
        "logs/{dataset}/train.tsv"
    params:
        cape=CAPE,
        labels=config["labels"] or "none",
        flags=cli_options("train"),  # every train.* key, so a new config key cannot be forgotten here
    threads: 2
    resources:
        mem_mb=3000,  # max_rss 0.93 GB on 5,000 cells × 33,000 genes (vocabulary: 300 used genes)
        runtime=240,
        gpu=gpus(),
    shell:
        "{params.cape} --threads {threads} train --input {input:q} --output {output.h5ad:q} --model-dir {output.model:q}"
        " --label-key {params.labels} {params.flags}"
        f"{LOG}"
