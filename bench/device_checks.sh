#!/usr/bin/env bash
# One run on a GPU machine: GPU tests, then benchmark commands, each under its own time limit so one
# slow step cannot take the rest with it.
#   bash bench/device_checks.sh "TEST PATHS" "CMD;CMD;..."   (TEST_S / STEP_S: limits in seconds;
#   TEST_K: a pytest -k expression, e.g. TEST_K="deepseek or router")
# Logs and result JSON go under $OUT (or bench/results when OUT is unset).
set -u
out="${OUT:-bench/results}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
if [ -n "${1:-}" ]; then
  timeout "${TEST_S:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 120 ${TEST_K:+-k "$TEST_K"} $1 2>&1 \
    | tee "$out/gpu-tests.log" | tail -25
fi
IFS=';' read -ra cmds <<< "${2:-}"
for c in "${cmds[@]}"; do
  [ -z "${c// }" ] && continue
  echo "== $c"
  start=$(date +%s)
  timeout "${STEP_S:-300}" $c --out "$out" 2>&1 | tee -a "$out/bench.log" | grep -v "^RESULT" | tail -12
  echo "   ($(( $(date +%s) - start )) s)"
done
