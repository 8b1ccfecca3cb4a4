#!/usr/bin/env bash
# At REV (full sha): the image inputs' GPU tests (native decoder, split, images, DCT route, lifetimes); one JPEG to a
# ViT-L-14 embedding split and on one thread (image_latency.py, twice); one JPEG a request at 50 req/s on fresh
# servers, split, one thread, split.
rev=$1; export CLIP_FLASH_GIT_REVISION=$rev; short=${rev:0:7}; R=/tmp/ry; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_y.sh $R/
timeout 170 python3 -m pytest -q -rs -p no:cacheprovider tests/inputs/test_native_decoder.py tests/inputs/test_jpeg_entropy_split.py tests/inputs/test_images_gpu.py tests/inputs/test_jpeg_dct_gpu.py tests/inputs/test_images_lifetime_gpu.py > $R/gpu_tests_inputs_$short.log 2>&1; echo "rc=$?" >> $R/gpu_tests_inputs_$short.log
tail -n 2 $R/gpu_tests_inputs_$short.log; echo "tests done at $(( $(date +%s) - start )) s"
( cd $R && tar -czf $OUT/call_y.tgz . )
rm -rf /tmp/photos && cp -r .device/photos /tmp/photos
for run in a b; do
  mkdir -p $R/latency_$run
  timeout 110 python3 benchmarks/image_latency.py --photos /tmp/photos --model ViT-L-14 --requests 1000 --json $R/latency_$run/image_latency.json --markdown $R/latency_$run/image_latency.md > $R/latency_$run/latency.log 2>&1; echo "rc=$?" >> $R/latency_$run/latency.log
  head -12 $R/latency_$run/image_latency.md | tail -n 4; echo "latency $run done at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_y.tgz . )
done
serve() {  # name server-args
  now=$(date +%s); if (( now - start > 470 )); then echo "skip $1 at $((now-start)) s"; return; fi
  timeout 100 python3 benchmarks/serve/bench_serve.py --configs clip_flash --workloads image-raw --no-wrk --photos /tmp/photos --rates 50 --duration 12 "--server-args=$2" --results $R/$1 > $R/$1.log 2>&1
  grep -E "^\| 50" $R/$1/serve_bench.md | head -n 2; echo "$1 done at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_y.tgz . )
}
serve serve_50rps_split_a ''
serve serve_50rps_one_thread_a '--no-split-jpegs'
serve serve_50rps_split_b ''
