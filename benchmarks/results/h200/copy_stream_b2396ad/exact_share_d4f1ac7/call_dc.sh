#!/usr/bin/env bash
# One H200 at NEW: the server's GPU tests (the copy stream, --exact-share); the ViT-B-32 --decode gpu server at one
# JPEG a request, fresh servers with --exact-share 0, 0.35, 0, 0.35 alternated.
new=$1; R=/tmp/rdc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_dc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
pack() { ( cd $R && tar -czf $OUT/call_dc.tgz . ); }
CLIP_FLASH_GIT_REVISION=$new timeout 270 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/serve/test_serve_gpu.py > $R/gpu_tests_serve_$new.log 2>&1
tail -n 3 $R/gpu_tests_serve_$new.log; grep -E "FAILED|ERROR" $R/gpu_tests_serve_$new.log | head; echo "tests done at $(( $(date +%s) - start )) s"; pack
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 570 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
b32() { run b32_$1 $root $new 100 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk --photos $root/.device/photos --rates 6000,7000,8000,9000 --duration 3 --results $R/b32_$1 "--server-args=--exact-share $2"; grep -E "^\| *[6-9],000" $R/b32_$1/serve_bench.md | cut -d'|' -f2-12 | head -4; grep -iE "ready after" $R/b32_$1/serve_bench.md | head -1 | cut -c1-200; }
b32 share0_a 0; b32 share035_a 0.35; b32 share0_b 0; b32 share035_b 0.35
pack; echo "all done at $(( $(date +%s) - start )) s"
