#!/usr/bin/env bash
# One H200 at NEW: the image inputs' lifetime GPU tests and the server's GPU tests (the collector's hand-off, the
# scan's views of the request bytes).
new=$1; R=/tmp/red; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ed.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
pack() { ( cd $R && tar -czf $OUT/call_ed.tgz . ); }
CLIP_FLASH_GIT_REVISION=$new timeout 110 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/inputs/test_images_lifetime_gpu.py > $R/gpu_tests_lifetime_$new.log 2>&1; echo "rc=$?" >> $R/gpu_tests_lifetime_$new.log
tail -n 3 $R/gpu_tests_lifetime_$new.log; echo "lifetime done at $(( $(date +%s) - start )) s"; pack
left=$(( 290 - ($(date +%s) - start) ))
CLIP_FLASH_GIT_REVISION=$new timeout $left python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/serve/test_serve_gpu.py > $R/gpu_tests_serve_$new.log 2>&1; echo "rc=$? (limit $left s)" >> $R/gpu_tests_serve_$new.log
tail -n 3 $R/gpu_tests_serve_$new.log; grep -E "FAILED|ERROR" $R/gpu_tests_serve_$new.log | head -5
pack; echo "all done at $(( $(date +%s) - start )) s"
