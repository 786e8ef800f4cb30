# cape workflow: preprocessing → causal graph → hyperbolic embedding → rotary encoding → training → evaluation.
#   snakemake --cores 2                                  # the embedded default dataset (offline)
#   snakemake --cores 2 --config input=path/to.h5ad      # your data; results in results/<file stem>/
#   snakemake --cores 2 --config input=screen.h5ad perturbations=condition   # Perturb-seq: predict held-out perturbations
#   snakemake --profile configs/profiles/slurm           # on a cluster (see README)
from snakemake.utils import min_version

min_version("8.0")


configfile: "configs/config.yaml"


# A run is one folder under results/ (so results/<run>/perturbation/ is never read as a run of its own)
wildcard_constraints:
    dataset="[^/]+",


include: "workflows/rules/common.smk"
include: "workflows/rules/preprocess.smk"
include: "workflows/rules/causal.smk"
include: "workflows/rules/embed.smk"
include: "workflows/rules/train.smk"
include: "workflows/rules/evaluate.smk"
include: "workflows/rules/predict.smk"
include: "workflows/rules/perturb.smk"


# configs/benchmarks/*.yaml set benchmark.task and .dataset: the workflow then makes that table, not the pipeline
BENCHMARK = bool(config["benchmark"].get("task") or config["benchmark"].get("dataset"))
if BENCHMARK:

    include: "workflows/rules/benchmarks.smk"


rule all:
    input:
        benchmark_outputs() if BENCHMARK else final_outputs(),
    default_target: True
