#!/usr/bin/env bash
# At REV: the server with ViT-B-32 --decode gpu, one JPEG a request (raw bytes), image batches of at most 64
# (the default), 128 and 256 (--max-batch), on fresh servers: does a larger batch amortize the host step?
rev=$1; R=/tmp/rr; rm -rf $R; mkdir -p $R; start=$(date +%s)
rm -rf /tmp/photos && cp -r .device/photos /tmp/photos
run() {  # name max-batch
  now=$(date +%s); if (( now - start > 430 )); then echo "skip $1 at $((now-start)) s"; return; fi
  timeout 140 python3 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk --photos /tmp/photos --start-rps image-raw=5000 --factor 1.25 --refine 3 --duration 3 --server-args "--max-batch $2" --results $R/$1 > $R/$1.log 2>&1
  grep -m1 "req/s (" $R/$1/serve_bench.md; grep "offered" $R/$1.log | cut -c1-150; echo "$1 at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_r_$1.tgz $1 $1.log )
}
run mb256_a 256; run mb64_a 64; run mb128_a 128; run mb256_b 256; run mb64_b 64
