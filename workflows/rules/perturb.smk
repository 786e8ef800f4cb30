rule perturb:
    """Perturbation mode (config perturbations): hold out whole perturbations, predict them with every predictor, score and report."""
    input:
        "results/{dataset}/preprocessed.h5ad",
    output:
        metrics="results/{dataset}/perturbation/metrics.json",
        table="results/{dataset}/perturbation/per_perturbation.tsv",
        split="results/{dataset}/perturbation/split.tsv",
        report="results/{dataset}/perturbation/report.md",
        plot="results/{dataset}/perturbation/shifts.png",
    log:
        "logs/{dataset}/perturb.log",
    benchmark:
        "logs/{dataset}/perturb.tsv"
    params:
        cape=CAPE,
        key=lambda wildcards: shlex.quote(str(config["perturbations"])),
        out_dir=lambda wildcards: f"results/{wildcards.dataset}/perturbation",
        # every perturb.* key, so a new config key cannot be forgotten here; transformer is on/off explicitly
        flags=cli_options("perturb", skip=("transformer", "cell_eval", "gears")),
        transformer=("--transformer" if config["perturb"]["transformer"] else "--no-transformer")
        + (" --cell-eval" if config["perturb"].get("cell_eval", True) else " --no-cell-eval")
        + f" --gears {str(config['perturb'].get('gears', 'auto')).lower()}",  # auto | true | false
    threads: 2
    resources:
        mem_mb=2000,
        runtime=120,
        gpu=gpus(),
    shell:
        "{params.cape} --threads {threads} perturb --input {input:q} --perturbations {params.key}"
        " --out-dir {params.out_dir:q} --name {wildcards.dataset} {params.flags} {params.transformer}"
        f"{LOG}"
