#!/usr/bin/env bash
# One H200 at REV (literal full hash): the early launch's GPU tests; the hand-offs of one JPEG a request at 50
# req/s (ViT-L-14) with --no-early-launch, then the default (early launch), every server process stamping; the input
# GPU tests (the preparer and the native batch changed).
rev=$1; R=/tmp/roc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_oc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_oc.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 590 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run gpu_tests_early 90 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/ops/test_host_gate_gpu.py \
    tests/inputs/test_early_layout_gpu.py tests/serve/test_early_launch_gpu.py
run trace_usual 100 python3 benchmarks/serve/handoff_trace.py --out $R/trace_usual -- --configs clip_flash \
    --workloads image-raw --no-wrk --photos .device/photos --rates 50 --duration 16 --server-args=--no-early-launch
run trace_early 100 python3 benchmarks/serve/handoff_trace.py --out $R/trace_early -- --configs clip_flash \
    --workloads image-raw --no-wrk --photos .device/photos --rates 50 --duration 16
run gpu_tests_inputs 240 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/inputs
pack; echo "all done at $(( $(date +%s) - start )) s"
