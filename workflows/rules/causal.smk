rule causal:
    """Step I: the causal gene graph (variational NOTEARS, paper Sec. 3.3, or the parents-MLP SEM) into varp['cape_dag']."""
    input:
        "results/{dataset}/preprocessed.h5ad",
    output:
        "results/{dataset}/causal.h5ad",
    log:
        "logs/{dataset}/causal.log",
    benchmark:
        "logs/{dataset}/causal.tsv"
    params:
        cape=CAPE,
        opts=config["causal"],
        rank=lambda wildcards: config["causal"]["rank"] if config["causal"]["rank"] else "dense",
        lambda_sparse=(f"--lambda-sparse {config['causal']['lambda_sparse']}"
                       if config["causal"]["lambda_sparse"] is not None else ""),
        h_every=config["causal"]["h_every"] or "auto",
        max_steps=config["causal"]["max_steps"] or "none",
        budget_cells=config["causal"]["budget_cells"] or "all",
        fill_fdr=config["causal"]["budget_fill_fdr"] or "none",
        layer=f"--layer {config['causal']['layer']}" if config["causal"]["layer"] else "",
        confidence=("" if config["causal"].get("edge_confidence", True) else "--no-edge-confidence")
        + (" --drop-guesses" if config["causal"].get("drop_guesses", False) else "")
        + ("" if config["causal"].get("orient_by_likelihood", True) else " --no-orient-by-likelihood"),
        interventions=(interventions_flag()
                       + ("" if config["causal"].get("leave_out_targets", True) else " --no-leave-out-targets")
                       + ("" if config["causal"].get("orient_by_shifts", True) else " --no-orient-by-shifts")
                       if config["causal"].get("interventions") else ""),
    threads: 2
    resources:
        mem_mb=2000,  # max_rss 0.83 GB on 5,000 cells × 33,000 genes (300 used)
        runtime=120,
        gpu=gpus(),
    shell:
        "{params.cape} --threads {threads} causal"
        " --input {input:q} --output {output:q}"
        " --model {params.opts[model]} --rank {params.rank} --tau {params.opts[tau]} --budget-fdr {params.opts[budget_fdr]}"
        " --budget-fill-fdr {params.fill_fdr} --budget-test {params.opts[budget_test]} --pair-ranking {params.opts[pair_ranking]}"
        " --budget-cells {params.budget_cells} --min-positioned {params.opts[min_positioned]}"
        " {params.lambda_sparse}"
        " --epochs {params.opts[epochs]} --max-steps {params.max_steps} --batch-size {params.opts[batch_size]} --lr {params.opts[lr]}"
        " --use-genes {params.opts[use_genes]} --h-every {params.h_every} --screen {params.opts[screen]}"
        " {params.layer} {params.interventions} {params.confidence}"
        f"{LOG}"
