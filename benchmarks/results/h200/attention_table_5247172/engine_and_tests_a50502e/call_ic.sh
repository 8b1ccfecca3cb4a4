#!/usr/bin/env bash
# One H200 at NEW (the H200 attention table shipped): GPU tests of the backends, graphs, patch and server with the
# table in use; then the table against no table (the file moved away) on ViT-B-32's engine load and image graphs.
new=$1; R=/tmp/ric; rm -rf $R; mkdir -p $R/ab; start=$(date +%s)
cp .device/call_ic.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
T=clip_flash/backends/attention_tables/nvidia-h200.json
pack() { ( cd $R && tar -czf $OUT/call_ic.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( CLIP_FLASH_GIT_REVISION=$new timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
python3 -m clip_flash.info > $R/info.txt 2>&1
run gpu_tests_patch 150 python3 -m pytest -q -rs -m gpu tests/backends tests/graphs tests/patching
tail -2 $R/gpu_tests_patch.log
run gpu_tests_serve 230 python3 -m pytest -q -rs tests/serve/test_serve_gpu.py
tail -2 $R/gpu_tests_serve.log
side() {  # table|none k
  [ $1 = none ] && mv $T /tmp/h200_table.json
  run startup_B32_$1_$2 60 python3 benchmarks/serve/startup_profile.py --model ViT-B-32 --variant as-is --results $R/ab/startup_B32_$1_$2
  run b32_images_$1_$2 45 python3 benchmarks/bench_clip.py --model ViT-B-32 --towers image --cuda-graphs \
      --batch-sizes 1 16 256 --graph-batch-sizes 1 16 256 --times 100 \
      --json $R/ab/b32_images_$1_$2.json --markdown $R/ab/b32_images_$1_$2.md
  [ $1 = none ] && mv /tmp/h200_table.json $T
}
side table c; side none c
pack; echo "all done at $(( $(date +%s) - start )) s"
