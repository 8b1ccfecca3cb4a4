#!/usr/bin/env bash
# One H200 at NEW (the collector leaves nvJPEG's hardware decode to a background thread under load) against OLD
# (f8407b2): the GPU tests of the change; the ViT-B-32 --decode gpu server new, old, new, old; ViT-L-14 at 50 req/s.
new=$1; old=$2; R=/tmp/rfc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_fc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
( cd .old_tree && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1 ); echo "old built at $(( $(date +%s) - start )) s"
pack() { ( cd $R && tar -czf $OUT/call_fc.tgz . ); }
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run gpu_tests_$new $root $new 130 -m pytest -q -rs -p no:cacheprovider tests/inputs/test_nvjpeg_hardware_gpu.py tests/serve/test_serve_gpu.py
tail -n 2 $R/gpu_tests_$new.log; grep -E "FAILED|ERROR" $R/gpu_tests_$new.log | head -5
b32() { run b32_$1 $2 $3 100 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk --photos $root/.device/photos --rates 8000,9000,10000 --duration 3 --results $R/b32_$1; grep -E "^\| *[0-9]+,000" $R/b32_$1/serve_bench.md | cut -d'|' -f2-12 | head -4; grep -E "mean batch" $R/b32_$1/serve_bench.md | head -1; }
b32 new_a $root $new; b32 old_a $root/.old_tree $old; b32 new_b $root $new; b32 old_b $root/.old_tree $old
run lat50_new $root $new 70 benchmarks/serve/bench_serve.py --configs clip_flash --workloads image-raw --no-wrk --photos $root/.device/photos --rates 50 --duration 16 --results $R/lat50_new
grep -E "^\| *50\.0" $R/lat50_new/serve_bench.md | cut -d'|' -f2-12 | head -1
pack; echo "all done at $(( $(date +%s) - start )) s"
