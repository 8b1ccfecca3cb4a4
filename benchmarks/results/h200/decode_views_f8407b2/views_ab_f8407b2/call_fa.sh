#!/usr/bin/env bash
# One H200 at NEW (HEAD: encoded views) against OLD (e00caed): the image-input GPU tests of the views; the ViT-B-32
# --decode gpu server new, old, new, old; NEW with the engine's GIL switch interval at 0.5 ms (experiment: .device/si).
new=$1; old=$2; R=/tmp/rfa; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_fa.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
( cd .old_tree && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1 ); echo "old built at $(( $(date +%s) - start )) s"
pack() { ( cd $R && tar -czf $OUT/call_fa.tgz . ); }
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=${EXTRA_PATH:+$EXTRA_PATH:}/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run gpu_tests_views_$new $root $new 150 -m pytest -q -rs -p no:cacheprovider tests/inputs/test_native_decoder.py tests/inputs/test_jpeg_entropy_split.py tests/inputs/test_nvjpeg_hardware_gpu.py tests/inputs/test_images_gpu.py
tail -n 2 $R/gpu_tests_views_$new.log; grep -E "FAILED|ERROR" $R/gpu_tests_views_$new.log | head -5
b32() { run b32_$1 $2 $3 100 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk --photos $root/.device/photos --rates 7000,8000,9000 --duration 3 --results $R/b32_$1; grep -E "^\| *[6-9],000" $R/b32_$1/serve_bench.md | cut -d'|' -f2-12 | head -3; grep -E "mean batch" $R/b32_$1/serve_bench.md | head -1; }
b32 new_a $root $new; b32 old_a $root/.old_tree $old; b32 new_b $root $new
EXTRA_PATH=$root/.device/si CLIP_FLASH_EXP_SWITCH_MS=0.5 b32 new_si05_a $root $new+si0.5
pack; echo "all done at $(( $(date +%s) - start )) s"
