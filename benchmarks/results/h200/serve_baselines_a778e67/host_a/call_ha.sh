#!/usr/bin/env bash
# One H200 at NEW: the serve bench's second and first baselines (--no-patch --inputs stock; the operator's FastAPI
# server) beside the clip_flash server, ViT-L-14, on the same host in one call (issue 28's baselines).
new=$1; R=/tmp/rha; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ha.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
pack() { ( cd $R && tar -czf $OUT/call_ha.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( CLIP_FLASH_GIT_REVISION=$new timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run baselines 330 benchmarks/serve/bench_serve.py --configs stock-inputs,operator --workloads image-raw,caption,captions64 --no-wrk --photos $root/.device/photos --duration 3 --warmup 1 --refine 3 --results $R/baselines
grep -A12 "^## Targets" $R/baselines/serve_bench.md | cut -c1-200
run clip_flash 200 benchmarks/serve/bench_serve.py --configs clip_flash --workloads image-raw,caption,captions64 --no-wrk --photos $root/.device/photos --start-rps image-raw=1600,caption=10000,captions64=1000 --factor 1.25 --refine 2 --duration 3 --warmup 1 --results $R/clip_flash
grep -A12 "^## Targets" $R/clip_flash/serve_bench.md | cut -c1-200
pack; echo "all done at $(( $(date +%s) - start )) s"
