#!/usr/bin/env bash
# The GPU figures of issue 56 in one prepared command on a lent GPU machine (docs/benchmarks/throughput.md).
#
# Here, once: `make device-wheels` (fills the git-ignored .whl/ with what the machine's image lacks).
# There, from the repository root, one call per part, each carrying .whl:
#   bash benchmarks/device_checks.sh scale           # the gpu tests, then `cape-bench throughput` on CUDA:
#                                                    # 2,000 genes x 10,000 cells, every stage (a few minutes)
#   bash benchmarks/device_checks.sh transcriptome   # Step I and Step II at 10,000 genes x 50,000 cells
#                                                    # (the simulation alone takes minutes; stopped at 9 min)
# Results go to $OUT (the device tool's folder that comes back), else to results/device.
set -euo pipefail
part=${1:-scale}
out=${OUT:-results/device}
mkdir -p "$out"
if [ ! -d .whl ]; then
  echo "no .whl/ here: run 'make device-wheels' on the development machine and carry .whl" >&2
  exit 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD:$PWD/benchmarks" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.csv"
python3 -c "import torch, cape; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee "$out/versions.txt"
case "$part" in
  scale)
    # Only the modules holding gpu tests: collecting the others would import what the image lacks (Snakemake, nbclient).
    python3 -m pytest -q -m gpu -p no:cacheprovider $(grep -l "mark.gpu" tests/*.py benchmarks/tests/*.py) 2>&1 \
      | tail -n 30 > "$out/gpu_tests.log" || true  # a failing gpu test is in the log; the timings still run
    timeout 480 python3 -m cape_benchmarks throughput --devices cuda --out "$out/scale" 2>&1 \
      | tail -n 40 > "$out/scale.log"
    ;;
  transcriptome)
    # The device tool stops a command at 600 s (and returns what $OUT holds then): stop first, with the log.
    timeout 570 python3 -m cape_benchmarks throughput --devices cuda --design transcriptome \
      --out "$out/transcriptome" 2>&1 | tail -n 40 > "$out/transcriptome.log"
    ;;
  *)
    echo "unknown part '$part': scale or transcriptome" >&2
    exit 2
    ;;
esac
