#!/usr/bin/env bash
# One H200 at REV (literal full hash): the server's GPU tests (the batcher's early launch is on by default), the
# input GPU tests the last call's limit cut off (JPEG DCT route, lifetimes, nvJPEG), then the patching GPU tests.
rev=$1; R=/tmp/rod; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_od.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_od.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 370 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run gpu_tests_serve 170 python3 -m pytest -v -rs -p no:cacheprovider -m gpu tests/serve
run gpu_tests_inputs_tail 150 python3 -m pytest -v -rs -p no:cacheprovider -m gpu tests/inputs/test_jpeg_dct_gpu.py \
    tests/inputs/test_images_lifetime_gpu.py tests/inputs/test_nvjpeg_hardware_gpu.py
run gpu_tests_patching 90 python3 -m pytest -v -rs -p no:cacheprovider -m gpu tests/patching
pack; echo "all done at $(( $(date +%s) - start )) s"
