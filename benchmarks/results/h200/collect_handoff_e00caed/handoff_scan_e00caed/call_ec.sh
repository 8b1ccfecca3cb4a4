#!/usr/bin/env bash
# One H200: NEW (the collector hands off under load; the scan views its bytes) against OLD (57ef1c8): the native
# decoder's tests; the ViT-B-32 --decode gpu server at one JPEG a request, fresh servers new, old, new, old; the
# GPU tests of the image inputs and of the server at NEW.
new=$1; old=$2; R=/tmp/rec; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ec.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
( cd .old_tree && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1 ); echo "old built at $(( $(date +%s) - start )) s"
pack() { ( cd $R && tar -czf $OUT/call_ec.tgz . ); }
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run gpu_tests_native_$new $root $new 60 -m pytest -q -rs -p no:cacheprovider tests/inputs/test_native_decoder.py tests/inputs/test_jpeg_entropy_split.py
tail -n 2 $R/gpu_tests_native_$new.log; grep -E "FAILED|ERROR" $R/gpu_tests_native_$new.log | head -5
b32() { run b32_$1 $2 $3 100 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk --photos $root/.device/photos --rates 6000,7000,8000,9000 --duration 3 --results $R/b32_$1; grep -E "^\| *[6-9],000" $R/b32_$1/serve_bench.md | cut -d'|' -f2-12 | head -4; grep -E "mean batch" $R/b32_$1/serve_bench.md | head -1; }
b32 new_a $root $new; b32 old_a $root/.old_tree $old; b32 new_b $root $new; b32 old_b $root/.old_tree $old
run gpu_tests_inputs_$new $root $new 80 -m pytest -q -rs -p no:cacheprovider -m gpu tests/inputs/test_nvjpeg_hardware_gpu.py tests/inputs/test_images_lifetime_gpu.py
tail -n 2 $R/gpu_tests_inputs_$new.log; grep -E "FAILED|ERROR" $R/gpu_tests_inputs_$new.log | head -5
run gpu_tests_serve_$new $root $new 175 -m pytest -q -rs -p no:cacheprovider -m gpu tests/serve/test_serve_gpu.py
tail -n 2 $R/gpu_tests_serve_$new.log; grep -E "FAILED|ERROR" $R/gpu_tests_serve_$new.log | head -5
pack; echo "all done at $(( $(date +%s) - start )) s"
