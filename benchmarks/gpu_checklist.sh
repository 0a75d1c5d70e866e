#!/usr/bin/env bash
# The first run on a GPU machine, unattended, everything under one folder to bring back:
#   bash benchmarks/gpu_checklist.sh [FOLDER] [lease|full]   (FOLDER default: $OUT, else benchmarks/results/checklist)
# lease (default) fits one 10-minute command on an H100/H200: the CUDA tests in 8 processes, the sync check,
# benchmarks.gpu bandwidth + decode for the 1B and 8B shapes, the LoRA kernels alone (benchmarks.lora_kernels).
# full adds the 1B workload against transformers and HF batch-1 decode (about 30 minutes). Each part writes its
# log; a failing part does not stop the next; the folder is also packed into checklist.tgz (the device tool
# brings back few files). Exit status: failed parts.
set -u
DIR="${1:-${OUT:-benchmarks/results/checklist}}"
MODE="${2:-lease}"
WORK=$(mktemp -d)
mkdir -p "$DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
failed=0
part() {  # part NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*" | tee -a "$WORK/summary.txt"
  local start=$SECONDS
  timeout "$limit" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - start)) s" | tee -a "$WORK/summary.txt"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
}
nvidia-smi >"$WORK/nvidia-smi.txt" 2>&1
python3 -c "import sys, torch, triton, transformers; print(sys.version, torch.__version__, triton.__version__, transformers.__version__)" \
  >"$WORK/versions.txt" 2>&1
# CPU-only files (the C kernels, the offline sm_90a compile) run in the suite on any machine; not here
part tests 210 env OMP_NUM_THREADS=2 python3 -m pytest -q -p no:cacheprovider -n 8 --dist load --timeout 200 -rfE \
  tests/engine/kernels tests/engine/attention tests/engine/test_device.py tests/engine/test_sampler.py \
  tests/engine/speculative/test_spec_cuda.py tests/engine/lora/test_lora_triton.py \
  --ignore=tests/engine/kernels/test_offline_sm90.py --ignore=tests/engine/attention/test_cpu_paged.py \
  --ignore=tests/engine/attention/test_cpu_cache.py --ignore=tests/engine/attention/test_cpu_kernel_fp_env.py \
  --junitxml="$WORK/tests.xml"
part sync_debug 45 python3 -m benchmarks.gpu_sync_check
part decode 270 python3 -m benchmarks.gpu --models 1b,8b --parts bandwidth,decode --out "$WORK/decode"
part lora_kernels 90 python3 -m benchmarks.lora_kernels --out "$WORK/lora_kernels"
if [ "$MODE" = full ]; then
  part workload_1b 600 python3 -m benchmarks.gpu --models 1b --parts workload --hf-requests 64 --out "$WORK/w1b"
  part hf_decode 600 python3 -m benchmarks.gpu --models 1b,8b --parts hf_decode --out "$WORK/hf1"
fi
echo "failed parts: $failed" | tee -a "$WORK/summary.txt"
for f in "$WORK"/*.log; do echo "--- $(basename "$f")"; tail -n 8 "$f"; done
tar czf "$DIR/checklist.tgz" -C "$WORK" .
cp "$WORK/summary.txt" "$DIR/"
exit "$failed"
