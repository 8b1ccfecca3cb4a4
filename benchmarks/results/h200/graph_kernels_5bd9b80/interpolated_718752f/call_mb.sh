#!/usr/bin/env bash
# One H200 at NEW (literal full hash): the servers of call_kb.sh with the interpolated attention choice (ViT-B-32
# --decode gpu one JPEG a request, ViT-L-14 64 captions a request; table and none), then the ViT-L-14 engine's
# text replay costs timed again, alone and back to back (startup_profile --retime-text), in what time is left.
new=$1; t0=$(date +%s)
bash .device/call_kb.sh $new b32:table_a b32:none_a captions64:none_a captions64:table_a
R=/tmp/rmb; rm -rf $R; mkdir -p $R; cp .device/call_mb.sh $R/
left=$(( 590 - ($(date +%s) - t0) )); echo "startup profile limit ${left} s"
if (( left > 60 )); then
  CLIP_FLASH_GIT_REVISION=$new timeout $left python3 benchmarks/serve/startup_profile.py --model ViT-L-14 \
      --retime-text --results $R/startup_L14 > $R/startup_L14.log 2>&1; echo "rc=$?" >> $R/startup_L14.log
  tail -n 3 $R/startup_L14.log; grep -E "^Padded text" $R/startup_L14/startup_profile.md
fi
( cd $R && tar -czf $OUT/call_mb.tgz . ); echo "all done at $(( $(date +%s) - t0 )) s"
