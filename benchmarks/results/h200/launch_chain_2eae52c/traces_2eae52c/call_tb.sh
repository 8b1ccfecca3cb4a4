#!/usr/bin/env bash
# One H200, this tree at REV (literal full hash): two hand-off traces of one JPEG a request at 50 req/s (ViT-L-14),
# with the stamps that split a lone request's launches (gate, rows, replay, alloc).
rev=$1; R=/tmp/rtb; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_tb.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/ 2>/dev/null
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_tb.tgz . ); }
for name in trace_a trace_b; do
  ( timeout 100 python3 benchmarks/serve/handoff_trace.py --out $R/$name -- --configs clip_flash --workloads image-raw \
      --no-wrk --photos $PWD/.device/photos --rates 50 --duration 14 > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
done
