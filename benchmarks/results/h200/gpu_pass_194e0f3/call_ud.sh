#!/usr/bin/env bash
# One H200, this working tree on REV (literal full hash): the hardware JPEG route's GPU tests.
rev=$1; R=/tmp/rud; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ud.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_ud.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 555 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run gpu_tests_nvjpeg_hardware 200 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/inputs/test_nvjpeg_hardware_gpu.py
pack; echo "all done at $(( $(date +%s) - start )) s"
