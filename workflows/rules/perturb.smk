rule perturb:
    """Perturbation mode (config perturbations): hold out whole perturbations, predict them with every predictor, score and report."""
    input:
        "results/{dataset}/preprocessed.h5ad",
    output:
        metrics=perturbation_item("metrics.json"),
        table=perturbation_item("per_perturbation.tsv"),
        split=perturbation_item("split.tsv"),
        report=perturbation_item("report.md"),
        plot=perturbation_item("shifts.png"),
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
