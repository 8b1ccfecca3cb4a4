#!/usr/bin/env bash
# One H200, exploration: (1) the activation pass's launch shapes at the text tower's c_fc output, against
# torch's copy and the extension's bias_act; (2) every algorithm cuBLASLt's heuristic offers for the text tower's
# four projections (bias epilogue), against F.linear. Scripts under .device/exp (not part of the package).
new=$1; R=/tmp/rcb; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_cb.sh .device/exp/*.py $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
pack() { ( cd $R && tar -czf $OUT/call_cb.tgz . ); }
export CLIP_FLASH_GIT_REVISION=$new PYTHONPATH=/tmp/site:$PWD
timeout 200 python3 .device/exp/act_variants.py $R/act_variants.json > $R/act_variants.log 2>&1; echo "rc=$?" >> $R/act_variants.log
cat $R/act_variants.log | tail -45; echo "act done at $(( $(date +%s) - start )) s"; pack
timeout 240 python3 .device/exp/lt_algos.py $R/lt_algos.json 25600 1664 > $R/lt_algos.log 2>&1; echo "rc=$?" >> $R/lt_algos.log
tail -12 $R/lt_algos.log; echo "lt done at $(( $(date +%s) - start )) s"; pack
