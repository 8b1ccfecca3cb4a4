#!/usr/bin/env bash
# One H200 at REV (literal full hash): the GPU tests the 14d0493 tidy touches (server, early layout, host gate,
# native decoder), where a lone request's host time goes (image_latency --host-steps --python-profile), then
# 50-800 one-JPEG req/s with the early launch off and on (one pair).
rev=$1; R=/tmp/rqa; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_qa.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_qa.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 560 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 2 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run gpu_tests_serve 170 python3 -m pytest -v -rs -p no:cacheprovider -m gpu tests/serve tests/ops/test_host_gate_gpu.py \
    tests/inputs/test_early_layout_gpu.py tests/inputs/test_native_decoder.py
run latency 120 python3 benchmarks/image_latency.py --photos .device/photos --model ViT-L-14 --requests 300 \
    --host-steps --python-profile $R/latency/python_profile.txt --json $R/latency/image_latency.json \
    --markdown $R/latency/image_latency.md
for side in usual early; do
  extra=(); [[ $side == usual* ]] && extra=(--server-args=--no-early-launch)
  run rates_$side 120 python3 benchmarks/serve/bench_serve.py --configs clip_flash --workloads image-raw --no-wrk \
      --photos .device/photos --rates 50,200,400,800 --duration 8 "${extra[@]}" --results $R/rates_$side
done
pack; echo "all done at $(( $(date +%s) - start )) s"
