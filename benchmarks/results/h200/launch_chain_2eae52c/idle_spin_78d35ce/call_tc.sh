#!/usr/bin/env bash
# One H200, this tree at REV (literal full hash): the bell's tests, then one JPEG a request (ViT-L-14) untraced at
# 50 and 400 req/s with the batcher threads sleeping at once (--idle-spin-ms=0) and polling 50 ms
# (--idle-spin-ms=50), alternated sleep, poll, sleep, poll; then the serving GPU tests in the time left.
rev=$1; R=/tmp/rtc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_tc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_tc.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 560 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run tests_idle_spin 60 python3 -m pytest -q -rs -p no:cacheprovider tests/serve/test_idle_spin.py
curve() {  # name spin_ms
  run $1 100 python3 benchmarks/serve/bench_serve.py --results $R/$1 --configs clip_flash --workloads image-raw \
      --no-wrk --photos $PWD/.device/photos --rates 50,400 --duration 10 --server-args=--idle-spin-ms=$2
}
curve serve_sleep_a 0
curve serve_poll_a 50
curve serve_sleep_b 0
curve serve_poll_b 50
left=$(( 565 - ($(date +%s) - start) ))
run gpu_tests_serve $left python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/serve
pack; echo "all done at $(( $(date +%s) - start )) s"
