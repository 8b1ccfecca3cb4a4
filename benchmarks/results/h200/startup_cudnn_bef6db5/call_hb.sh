#!/usr/bin/env bash
# One H200 at NEW: the operator's FastAPI server (issue 28's first baseline) beside the clip_flash server's one-JPEG
# curve, ViT-L-14, on the same host; then where the clip_flash server's start-up goes (startup_profile.py).
new=$1; R=/tmp/rhb; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_hb.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
pack() { ( cd $R && tar -czf $OUT/call_hb.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( CLIP_FLASH_GIT_REVISION=$new timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
python3 -c "import fastapi; print('fastapi', fastapi.__version__)"
run operator 220 benchmarks/serve/bench_serve.py --configs operator --workloads image-raw,caption,captions64 --no-wrk --photos $root/.device/photos --start-rps image-raw=8,caption=100,captions64=10 --factor 2 --refine 3 --duration 4 --min-requests 60 --warmup 1 --results $R/operator
grep -E "^\*\*|^## op" $R/operator/serve_bench.md; tail -3 $R/operator.log
run clip_flash 150 benchmarks/serve/bench_serve.py --configs clip_flash --workloads image-raw --no-wrk --photos $root/.device/photos --start-rps image-raw=1600 --factor 1.25 --refine 2 --duration 3 --warmup 1 --results $R/clip_flash
grep -E "^\*\*" $R/clip_flash/serve_bench.md; grep -A10 "^## Targets" $R/clip_flash/serve_bench.md | grep "first baseline"
run startup 150 benchmarks/serve/startup_profile.py --model ViT-L-14 --variant as-is no-empty-cache --results $R/startup
tail -60 $R/startup.log
pack; echo "all done at $(( $(date +%s) - start )) s"
