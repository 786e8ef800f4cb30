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
        "benchmarks/{dataset}/train.tsv"
    params:
        cape=CAPE,
        opts=config["train"],
        labels=config["labels"] or "none",
    threads: 2
    resources:
        mem_mb=3000,  # max_rss 0.93 GB on 5,000 cells × 33,000 genes (vocabulary: 300 used genes)
        runtime=240,
        gpu=0,
    shell:
        "{params.cape} train --input {input:q} --output {output.h5ad:q} --model-dir {output.model:q}"
        " --label-key {params.labels} --fine-tune-fraction {params.opts[fine_tune_fraction]}"
        " --architecture {params.opts[architecture]} --encoding {params.opts[encoding]}"
        " --vocabulary {params.opts[vocabulary]}"
        " --d-model {params.opts[d_model]} --n-layers {params.opts[n_layers]} --n-heads {params.opts[n_heads]}"
        " --max-len {params.opts[max_len]} --pretrain-epochs {params.opts[pretrain_epochs]}"
        " --epochs {params.opts[epochs]} --batch-size {params.opts[batch_size]} --lr {params.opts[lr]}"
        " > {log:q} 2>&1"
