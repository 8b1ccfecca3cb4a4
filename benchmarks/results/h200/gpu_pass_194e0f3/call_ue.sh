#!/usr/bin/env bash
# One H200, this tree at REV (literal full hash): the GPU tests outside the serve, input, job, patch, kernel and graph wings.
rev=$1; R=/tmp/rue; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ue.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_ue.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 555 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run gpu_tests_rest 300 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/backends tests/benchmarks tests/models tests/test_cli.py tests/test_info.py tests/test_readme.py
pack; echo "all done at $(( $(date +%s) - start )) s"
