#!/usr/bin/env bash
# At REV: the server with ViT-B-32 --decode gpu, one JPEG a request (raw bytes), --decode-threads 1 (one image
# batch in its CPU step at a time, as before REV) against 2 (REV's default), alternated on fresh servers.
rev=$1; R=/tmp/rq; rm -rf $R; mkdir -p $R; start=$(date +%s)
rm -rf /tmp/photos && cp -r .device/photos /tmp/photos
run() {  # name decode-threads
  now=$(date +%s); if (( now - start > 450 )); then echo "skip $1 at $((now-start)) s"; return; fi
  timeout 130 python3 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk --photos /tmp/photos --start-rps image-raw=5000 --factor 1.25 --refine 3 --duration 3 --server-args "--decode-threads $2" --results $R/$1 > $R/$1.log 2>&1
  grep -m1 "req/s (" $R/$1/serve_bench.md; grep "offered" $R/$1.log | cut -c1-150; echo "$1 at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_q_$1.tgz $1 $1.log )
}
run threads1_a 1; run threads2_a 2; run threads1_b 1; run threads2_b 2
