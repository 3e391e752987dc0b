#!/usr/bin/env bash
# One run on a GPU machine: GPU tests, then benchmarks. Usage: bash bench/device_checks.sh "TESTS" "BENCH ARGS;..."
# Logs and result JSON go under $OUT (or bench/results when OUT is unset).
set -u
out="${OUT:-bench/results}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
if [ -n "${1:-}" ]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider $1 2>&1 | tee "$out/gpu-tests.log" | tail -25
fi
IFS=';' read -ra runs <<< "${2:-}"
for r in "${runs[@]}"; do
  [ -z "$r" ] && continue
  echo "== bench: $r"
  python3 bench/throughput.py $r --out "$out" 2>&1 | tee -a "$out/bench.log" | grep -v "^RESULT" | tail -4
done
