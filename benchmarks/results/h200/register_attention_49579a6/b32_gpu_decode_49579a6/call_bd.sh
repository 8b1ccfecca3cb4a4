#!/usr/bin/env bash
# One H200 at NEW: the server's GPU tests again with the official openai client carried (the last call's host
# lacked it); then ViT-B-32 with --decode gpu, one JPEG a request, at fixed rates.
new=$1; R=/tmp/rbd; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_bd.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
pack() { ( cd $R && tar -czf $OUT/call_bd.tgz . ); }
CLIP_FLASH_GIT_REVISION=$new timeout 100 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/serve/test_serve_gpu.py > $R/gpu_tests_serve_$new.log 2>&1
tail -n 3 $R/gpu_tests_serve_$new.log; echo "tests done at $(( $(date +%s) - start )) s"; pack
now=$(date +%s); left=$(( 200 - (now - start) ))
if (( left > 40 )); then
  CLIP_FLASH_GIT_REVISION=$new timeout $left python3 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk --photos $PWD/.device/photos --rates 6000,7000,8000 --duration 3 --results $R/serve_b32_gpu_decode > $R/serve_b32_gpu_decode.log 2>&1
  grep -E "^\| *[6-8],000" $R/serve_b32_gpu_decode/serve_bench.md | cut -d'|' -f2-9 | head -4
fi
pack; echo "all done at $(( $(date +%s) - start )) s"
