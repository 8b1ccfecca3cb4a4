#!/usr/bin/env bash
# One H200 at REV (literal full hash): the early launch's GPU tests (host gate, early layout, the batcher), then
# ViT-L-14 one JPEG a request at 50 req/s for 16 s on fresh servers, --no-early-launch and the default alternated
# (usual, early, usual, early) on this one host.
rev=$1; R=/tmp/rob; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ob.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_ob.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 590 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
python3 -m clip_flash.info > $R/info.txt 2>&1
run gpu_tests_early 120 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/ops/test_host_gate_gpu.py \
    tests/inputs/test_early_layout_gpu.py tests/serve/test_early_launch_gpu.py
for side in usual_a early_a usual_b early_b; do
  extra=(); [[ $side == usual* ]] && extra=(--server-args=--no-early-launch)
  run lat50_$side 100 python3 benchmarks/serve/bench_serve.py --configs clip_flash --workloads image-raw --no-wrk \
      --photos .device/photos --rates 50 --duration 16 "${extra[@]}" --results $R/lat50_$side
  grep -E "^\| *clip_flash" $R/lat50_$side/serve_bench.md | head -2
done
pack; echo "all done at $(( $(date +%s) - start )) s"
