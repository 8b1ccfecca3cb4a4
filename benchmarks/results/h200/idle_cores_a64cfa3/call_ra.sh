#!/usr/bin/env bash
# One H200 at REV (literal full hash): GPU tests the one-call device step touches beyond last session's set (the
# server, the input tail); then the hand-offs at 50 one-JPEG req/s (ViT-L-14) with each call's thread CPU time,
# early launch on and off alternated (usual, early, usual, early): where the device step's and the encoder call's
# 0.4 ms each go (CPU work or waiting), and whether the early launch still helps.
rev=$1; R=/tmp/rra; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ra.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_ra.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 585 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
for side in usual_a early_a usual_b early_b; do
  extra=(); [[ $side == usual* ]] && extra=(--server-args=--no-early-launch)
  run trace_$side 95 python3 benchmarks/serve/handoff_trace.py --out $R/trace_$side -- --configs clip_flash \
      --workloads image-raw --no-wrk --photos .device/photos --rates 50 --duration 14 "${extra[@]}"
done
run gpu_tests_serve 200 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/serve
pack; echo "all done at $(( $(date +%s) - start )) s"
