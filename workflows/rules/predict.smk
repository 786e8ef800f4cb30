rule predict:
    """Knock-out / over-expression predicted from Step I's structural equations (config predict.intervene)."""
    input:
        "results/{dataset}/causal.h5ad",
    output:
        h5ad="results/{dataset}/predict/predicted.h5ad",
        table=report("results/{dataset}/predict/shifts.tsv", caption="../report/predict.rst",
                     category="6. Predictions", labels={"run": "{dataset}", "item": "shifts.tsv"}),
        plot=report("results/{dataset}/predict/shifts.png", caption="../report/predict.rst",
                    category="6. Predictions", labels={"run": "{dataset}", "item": "shifts.png"}),
    log:
        "logs/{dataset}/predict.log",
    params:
        cape=CAPE,
        intervene=" ".join(shlex.quote(item) for item in config["predict"]["intervene"]),
        opts=config["predict"],
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    shell:
        "{params.cape} --threads {threads} predict --input {input:q} --intervene {params.intervene}"
        " --mode {params.opts[mode]} --equations {params.opts[equations]} --top {params.opts[top]}"
        " --output {output.h5ad:q} --table {output.table:q} --plot {output.plot:q} " f"{LOG}"
