#!/usr/bin/env bash
# At REV (full sha), another draw: one JPEG to a ViT-L-14 embedding (image_latency.py), then one JPEG a request at
# 50 req/s on two fresh servers (the default: split).
rev=$1; export CLIP_FLASH_GIT_REVISION=$rev; R=/tmp/rac; rm -rf $R; mkdir -p $R/latency; start=$(date +%s)
cp .device/call_ac.sh $R/
rm -rf /tmp/photos && cp -r .device/photos /tmp/photos
timeout 110 python3 benchmarks/image_latency.py --photos /tmp/photos --model ViT-L-14 --requests 1000 --json $R/latency/image_latency.json --markdown $R/latency/image_latency.md > $R/latency/latency.log 2>&1; echo "rc=$?" >> $R/latency/latency.log
head -12 $R/latency/image_latency.md | tail -n 4; echo "latency done at $(( $(date +%s) - start )) s"
( cd $R && tar -czf $OUT/call_ac.tgz . )
for run in a b; do
  now=$(date +%s); if (( now - start > 250 )); then echo "skip $run"; continue; fi
  timeout 100 python3 benchmarks/serve/bench_serve.py --configs clip_flash --workloads image-raw --no-wrk --photos /tmp/photos --rates 50 --duration 12 "--server-args=" --results $R/serve_50rps_split_$run > $R/serve_50rps_split_$run.log 2>&1
  grep -E "^\| 50" $R/serve_50rps_split_$run/serve_bench.md | head -n 2; echo "serve $run done at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_ac.tgz . )
done
