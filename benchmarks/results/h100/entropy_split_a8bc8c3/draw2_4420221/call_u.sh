#!/usr/bin/env bash
# At REV: the native decoder's tests; then one JPEG a request at 50 req/s on fresh ViT-L-14 servers, the entropy
# decode split (default) and --no-split-jpegs alternated split, one, one, split; then image_latency.py again.
rev=$1; R=/tmp/ru; rm -rf $R; mkdir -p $R; start=$(date +%s)
timeout 120 python3 -m pytest -q -rs -p no:cacheprovider tests/inputs/test_native_decoder.py tests/inputs/test_jpeg_entropy_split.py > $R/gpu_tests_native_decoder_$rev.log 2>&1; echo "rc=$?" >> $R/gpu_tests_native_decoder_$rev.log
tail -2 $R/gpu_tests_native_decoder_$rev.log; echo "tests done at $(( $(date +%s) - start )) s"
rm -rf /tmp/photos && cp -r .device/photos /tmp/photos
serve() {  # name server-args
  now=$(date +%s); if (( now - start > 420 )); then echo "skip $1 at $((now-start)) s"; return; fi
  timeout 100 python3 benchmarks/serve/bench_serve.py --configs clip_flash --workloads image-raw --no-wrk --photos /tmp/photos --rates 50 --duration 12 --server-args "$2" --results $R/$1 > $R/$1.log 2>&1
  grep -E "^\| 50 " $R/$1/serve_bench.md | head -2; echo "$1 done at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_u.tgz . )
}
serve serve_50rps_split_a ''
serve serve_50rps_one_thread_a '--no-split-jpegs'
serve serve_50rps_one_thread_b '--no-split-jpegs'
serve serve_50rps_split_b ''
now=$(date +%s)
if (( now - start < 470 )); then
  mkdir -p $R/latency_b
  timeout 110 python3 benchmarks/image_latency.py --photos /tmp/photos --model ViT-L-14 --requests 1000 --json $R/latency_b/image_latency.json --markdown $R/latency_b/image_latency.md > $R/latency_b/latency.log 2>&1; echo "rc=$?" >> $R/latency_b/latency.log
  head -12 $R/latency_b/image_latency.md | tail -5
fi
echo "all done at $(( $(date +%s) - start )) s"
( cd $R && tar -czf $OUT/call_u.tgz . )
