#!/usr/bin/env bash
# One H200 at REV (literal full hash): ViT-L-14 one JPEG a request against the encoder alone, in one bench run, twice
# (fresh servers): issue 28's first target (at least 85% of the encoder-alone batch rate, p99 <= 100 ms).
rev=$1; R=/tmp/rmd; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_md.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
for run in a b; do
  left=$(( 300 - ($(date +%s) - start) )); (( left < 80 )) && { echo "skip $run"; continue; }
  CLIP_FLASH_GIT_REVISION=$rev timeout $left python3 benchmarks/serve/bench_serve.py --configs encoder,clip_flash \
      --workloads image-raw --refine 5 --no-wrk --photos .device/photos --results $R/jpeg_$run > $R/jpeg_$run.log 2>&1
  echo "rc=$?" >> $R/jpeg_$run.log; grep -E "one JPEG a request \(raw" $R/jpeg_$run/serve_bench.md | head -1
  echo "$run done at $(( $(date +%s) - start )) s"; ( cd $R && tar -czf $OUT/call_md.tgz . )
done
