#!/usr/bin/env bash
# One H200, this tree at REV (literal full hash): the GPU tests of the kernel and graph wings.
rev=$1; R=/tmp/ruc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_uc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_uc.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 555 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run gpu_tests_ops_graphs 420 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/ops tests/graphs
pack; echo "all done at $(( $(date +%s) - start )) s"
