#!/usr/bin/env bash
# One H200, this tree at REV (literal full hash): the GPU tests of the ops (the extension's bindings) and the graphs.
rev=$1; R=/tmp/rse; rm -rf $R; mkdir -p $R
cp .device/call_se.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
export CLIP_FLASH_GIT_REVISION=$rev
( timeout 185 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/ops tests/graphs > $R/gpu_tests_ops_graphs.log 2>&1; echo "rc=$?" >> $R/gpu_tests_ops_graphs.log )
tail -n 4 $R/gpu_tests_ops_graphs.log; ( cd $R && tar -czf $OUT/call_se.tgz . )
