#!/usr/bin/env bash
# One H100: is the stand-in's first use per thread? .device/probe/thread_first_uses.py, fresh process per model.
rev=$1; R=/tmp/rak; rm -rf $R; mkdir -p $R; cp .device/call_ak.sh .device/probe/thread_first_uses.py $R/
for m in ViT-L-14 ViT-B-32; do
  CLIP_FLASH_GIT_REVISION=$rev timeout 100 python3 .device/probe/thread_first_uses.py $m 256 $R/thread_$m.json > $R/thread_$m.log 2>&1; echo "rc=$?" >> $R/thread_$m.log; cat $R/thread_$m.log
done
( cd $R && tar -czf $OUT/call_ak.tgz . )
