#!/usr/bin/env bash
# One H200 at REV (literal full hash): the serve and jobs GPU tests with the shipped H200 attention table and the
# interpolated choice (what patched models in servers and jobs run).
rev=$1; R=/tmp/rmc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_mc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
python3 -m clip_flash.info > $R/info.txt 2>&1
for part in serve jobs; do
  left=$(( 570 - ($(date +%s) - start) )); (( left < 30 )) && { echo "skip $part"; continue; }
  CLIP_FLASH_GIT_REVISION=$rev timeout $left python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/$part \
      > $R/gpu_tests_$part.log 2>&1; echo "rc=$?" >> $R/gpu_tests_$part.log
  tail -n 4 $R/gpu_tests_$part.log; echo "$part done at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_mc.tgz . )
done
