#!/usr/bin/env bash
# At REV: one JPEG a request at 50 req/s on fresh ViT-L-14 servers, --no-split-jpegs and the default (split)
# alternated one, split, one.
rev=$1; R=/tmp/rv; rm -rf $R; mkdir -p $R; start=$(date +%s)
rm -rf /tmp/photos && cp -r .device/photos /tmp/photos
serve() {  # name server-args
  now=$(date +%s); if (( now - start > 430 )); then echo "skip $1 at $((now-start)) s"; return; fi
  timeout 100 python3 benchmarks/serve/bench_serve.py --configs clip_flash --workloads image-raw --no-wrk --photos /tmp/photos --rates 50 --duration 12 "--server-args=$2" --results $R/$1 > $R/$1.log 2>&1
  grep -E "^\| 50" $R/$1/serve_bench.md | head -2; echo "$1 done at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_v.tgz . )
}
serve serve_50rps_one_thread_a '--no-split-jpegs'
serve serve_50rps_split_c ''
serve serve_50rps_one_thread_b '--no-split-jpegs'
serve serve_50rps_split_d ''
