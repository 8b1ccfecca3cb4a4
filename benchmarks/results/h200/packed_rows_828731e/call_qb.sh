#!/usr/bin/env bash
# One H200 at REV (literal full hash): the GPU tests of the one-call device step (packed_rows) and the input and
# early-launch paths that use it; the hand-offs at 50 one-JPEG req/s (ViT-L-14), OLD (.device/old_<rev>, its
# Python with this build's extension) and this tree alternated old, new, old, new; then the lone request's host steps.
rev=$1; old=$2; R=/tmp/rqb; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_qb.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
cp clip_flash/_C*.so .device/old_${old:0:7}/clip_flash/
pack() { ( cd $R && tar -czf $OUT/call_qb.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 585 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
export CLIP_FLASH_GIT_REVISION=$rev
run gpu_tests 170 python3 -m pytest -v -rs -p no:cacheprovider -m gpu tests/inputs/test_packed_rows_gpu.py \
    tests/inputs/test_early_layout_gpu.py tests/serve/test_early_launch_gpu.py tests/ops/test_host_gate_gpu.py \
    tests/inputs/test_image_resample_gpu.py tests/inputs/test_jpeg_dct_gpu.py
trace() {  # name tree revision
  local name=$1 tree=$2
  run $name 95 bash -c "cd $tree && CLIP_FLASH_GIT_REVISION=$3 python3 benchmarks/serve/handoff_trace.py --out $R/$name -- \
      --configs clip_flash --workloads image-raw --no-wrk --photos $PWD/.device/photos --rates 50 --duration 14"
}
trace trace_old_a .device/old_${old:0:7} $old
trace trace_new_a . $rev
trace trace_old_b .device/old_${old:0:7} $old
trace trace_new_b . $rev
run latency 80 python3 benchmarks/image_latency.py --photos .device/photos --model ViT-L-14 --requests 300 \
    --host-steps --python-profile $R/latency/python_profile.txt --json $R/latency/image_latency.json \
    --markdown $R/latency/image_latency.md
pack; echo "all done at $(( $(date +%s) - start )) s"
