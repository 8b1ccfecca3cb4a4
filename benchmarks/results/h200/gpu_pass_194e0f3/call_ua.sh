#!/usr/bin/env bash
# One H200, this tree at REV (literal full hash): the serving GPU tests (pytest -m gpu tests/serve), then one JPEG a
# request (ViT-L-14) untraced at 50 and 400 req/s twice, then one hand-off trace at 50 req/s.
rev=$1; R=/tmp/rua; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ua.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_ua.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 555 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
curve() {
  run $1 100 python3 benchmarks/serve/bench_serve.py --results $R/$1 --configs clip_flash --workloads image-raw \
      --no-wrk --photos $PWD/.device/photos --rates 50,400 --duration 10
}
run gpu_tests_serve 200 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/serve
curve serve_a
curve serve_b
run trace_a 100 python3 benchmarks/serve/handoff_trace.py --out $R/trace_a -- --configs clip_flash --workloads image-raw \
      --no-wrk --photos $PWD/.device/photos --rates 50 --duration 14
pack; echo "all done at $(( $(date +%s) - start )) s"
