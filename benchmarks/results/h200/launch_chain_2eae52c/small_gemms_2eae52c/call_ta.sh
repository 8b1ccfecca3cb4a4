#!/usr/bin/env bash
# One H200, this tree at REV (literal full hash): small-row GEMM algorithms (exploration), then the GPU tests of
# the ops and the graphs.
rev=$1; R=/tmp/rta; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ta.sh .device/exp/lt_small.py $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_ta.tgz . ); }
( timeout 150 python3 .device/exp/lt_small.py $R/lt_small.json > $R/lt_small.log 2>&1; echo "rc=$?" >> $R/lt_small.log )
grep "==\|rc=\|built" $R/lt_small.log; echo "lt done at $(( $(date +%s) - start )) s"; pack
left=$(( 560 - ($(date +%s) - start) ))
( timeout $left python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/ops tests/graphs > $R/gpu_tests_ops_graphs.log 2>&1; echo "rc=$?" >> $R/gpu_tests_ops_graphs.log )
tail -n 4 $R/gpu_tests_ops_graphs.log; echo "all done at $(( $(date +%s) - start )) s"; pack
