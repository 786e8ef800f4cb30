rule embed:
    """Step II: embed varp['cape_dag'] in hyperbolic space (paper Sec. 3.4) → varm['cape_lorentz'] and varm['cape_poincare']."""
    input:
        "results/{dataset}/causal.h5ad",
    output:
        "results/{dataset}/embedded.h5ad",
    log:
        "logs/{dataset}/embed.log",
    benchmark:
        "logs/{dataset}/embed.tsv"
    params:
        cape=CAPE,
        opts=config["embed"],
        lr=lambda wildcards: f"--lr {config['embed']['lr']}" if config["embed"]["lr"] is not None else "",
    threads: 2
    resources:
        mem_mb=2000,  # max_rss 0.77 GB on 5,000 cells × 33,000 genes (300 used)
        runtime=60,
        gpu=gpus(),
    shell:
        "{params.cape} --threads {threads} embed"
        " --input {input:q} --output {output:q}"
        " --dim {params.opts[dim]} --k-hop {params.opts[k_hop]} --lambda-g {params.opts[lambda_g]}"
        " --restart {params.opts[restart]} --epochs {params.opts[epochs]}"
        " --optimizer {params.opts[optimizer]} --geometry {params.opts[geometry]}"
        " --negatives {params.opts[negatives]} --max-radius {params.opts[max_radius]}"
        " --init-scale {params.opts[init_scale]}"
        " --temperature {params.opts[temperature]} --isolated {params.opts[isolated]} {params.lr}"
        f"{LOG}"


rule encode:
    """Step III: rotary angles φ = c·e of every gene (paper Sec. 3.5) → varm['cape_angles']."""
    input:
        "results/{dataset}/embedded.h5ad",
    output:
        "results/{dataset}/encoded.h5ad",
    log:
        "logs/{dataset}/encode.log",
    benchmark:
        "logs/{dataset}/encode.tsv"
    params:
        cape=CAPE,
        opts=config["encode"],
    threads: 1
    resources:
        mem_mb=2000,  # max_rss 0.73 GB on 5,000 cells × 33,000 genes
        runtime=10,
        gpu=gpus(),
    shell:
        "{params.cape} --threads {threads} encode --input {input:q} --output {output:q} --scale {params.opts[scale]}"
        " --bands {params.opts[bands]} --band-top {params.opts[band_top]}"
        f"{LOG}"
