rule preprocess:
    """QC, library-size normalisation, log1p and highly variable genes (paper Supp. F.1.1)."""
    input:
        input_files,
    output:
        "results/{dataset}/preprocessed.h5ad",
    log:
        "logs/{dataset}/preprocess.log",
    benchmark:
        "logs/{dataset}/preprocess.tsv"
    params:
        cape=CAPE,
        source=input_spec(),
        opts=config["preprocess"],
        log1p="" if config["preprocess"]["log1p"] else "--no-log1p",
        transpose="--transpose" if config["preprocess"]["transpose"] else "",
        # Step I's perturbation labels: their targets join the HVGs, or Step I could not use them
        interventions=interventions_flag(),
    threads: 1
    resources:
        mem_mb=2000,  # max_rss 0.82 GB on a sparse 5,000 cells × 33,000 genes UMI matrix
        runtime=30,
        gpu=gpus(),
    shell:
        "{params.cape} --threads {threads} preprocess --input {params.source:q} --output {output:q}"
        " --min-genes {params.opts[min_genes]} --min-cells {params.opts[min_cells]}"
        " --target-sum {params.opts[target_sum]} --n-top-genes {params.opts[n_top_genes]}"
        " --hvg-flavor {params.opts[hvg_flavor]}"
        " {params.log1p} {params.transpose} {params.interventions}"
        f"{LOG}"
