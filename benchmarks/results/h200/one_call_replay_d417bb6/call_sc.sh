#!/usr/bin/env bash
# One H200, this tree at REV (literal full hash): the GPU tests of the jobs and the caption graphs (both replay CUDA
# graphs), then 64 captions a request (ViT-L-14) at fixed rates, to see the one-call replay's effect there.
rev=$1; R=/tmp/rsc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_sc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
pack() { ( cd $R && tar -czf $OUT/call_sc.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
export CLIP_FLASH_GIT_REVISION=$rev
run gpu_tests_jobs 200 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/jobs tests/patching
run gpu_tests_serve 170 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/serve
run captions64 150 python3 benchmarks/serve/bench_serve.py --results $R/captions64 --configs clip_flash \
    --workloads captions64 --no-wrk --photos .device/photos --rates 1300,1500,1700 --duration 8
pack; echo "all done at $(( $(date +%s) - start )) s"
