#!/usr/bin/env bash
# The first run on a GPU machine, unattended, everything under one folder to bring back:
#   bash benchmarks/gpu_checklist.sh [FOLDER]        (default: $OUT, else benchmarks/results/checklist)
# 1. the CUDA tests (kernels, attention, device, fused ops, variants, launch count)
# 2. one sampled decode step under torch.cuda.set_sync_debug_mode("error"): a hidden host sync fails
# 3. benchmarks.gpu for the 1B and 8B shapes (bandwidth, decode), then the 1B workload and HF decode
# Each part writes its log; a failing part does not stop the next. Exit status: failed parts.
set -u
DIR="${1:-${OUT:-benchmarks/results/checklist}}"
mkdir -p "$DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=0
part() {  # part NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*" | tee -a "$DIR/summary.txt"
  local start=$SECONDS
  timeout "$limit" "$@" >"$DIR/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - start)) s" | tee -a "$DIR/summary.txt"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
}
nvidia-smi >"$DIR/nvidia-smi.txt" 2>&1
part tests 900 python3 -m pytest -q -x tests/engine/kernels tests/engine/attention tests/engine/test_device.py \
  tests/engine/test_sampler.py --junitxml="$DIR/tests.xml"
part sync_debug 300 python3 -m benchmarks.gpu_sync_check
part decode 600 python3 -m benchmarks.gpu --models 1b,8b --parts bandwidth,decode --out "$DIR/decode"
part workload_1b 600 python3 -m benchmarks.gpu --models 1b --parts workload --hf-requests 64 --out "$DIR/w1b"
part hf_decode 600 python3 -m benchmarks.gpu --models 1b,8b --parts hf_decode --out "$DIR/hf1"
echo "failed parts: $failed; results in $DIR" | tee -a "$DIR/summary.txt"
exit "$failed"
