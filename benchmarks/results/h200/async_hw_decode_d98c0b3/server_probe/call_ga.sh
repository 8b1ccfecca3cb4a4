#!/usr/bin/env bash
# One H200 at NEW (exp/async-hw-decode: nvJPEG's hardware decode not waited for) against OLD (main before it):
# the image-input GPU tests of the change; the probe with and without the wait at the server's and the job's batch
# sizes; the ViT-B-32 --decode gpu server new, old, new, old (rates above 8,000 so Poisson arrivals reach it).
new=$1; old=$2; R=/tmp/rga; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ga.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
( cd .old_tree && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1 ); echo "old built at $(( $(date +%s) - start )) s"
pack() { ( cd $R && tar -czf $OUT/call_ga.tgz . ); }
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run gpu_tests_$new $root $new 100 -m pytest -q -rs -p no:cacheprovider tests/inputs/test_nvjpeg_hardware_gpu.py tests/inputs/test_images_lifetime_gpu.py
tail -n 2 $R/gpu_tests_$new.log; grep -E "FAILED|ERROR" $R/gpu_tests_$new.log | head -5
run probe_48 $root $new 40 benchmarks/probe_nvjpeg_concurrency.py --photos $root/.device/photos --batch 48 --batches 40 --threads 1 2 --wait yes no --rounds 3 --json $R/probe_48.json
run probe_256 $root $new 40 benchmarks/probe_nvjpeg_concurrency.py --photos $root/.device/photos --batch 256 --batches 10 --threads 1 2 --wait yes no --rounds 3 --json $R/probe_256.json
grep -h photos $R/probe_48.log $R/probe_256.log
b32() { run b32_$1 $2 $3 95 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk --photos $root/.device/photos --rates 8200,9000,10000 --duration 3 --results $R/b32_$1; grep -E "^\| *[0-9]+,[0-9]00" $R/b32_$1/serve_bench.md | cut -d'|' -f2-12 | head -3; grep -E "mean batch" $R/b32_$1/serve_bench.md | head -1; }
b32 new_a $root $new; b32 old_a $root/.old_tree $old; b32 new_b $root $new; b32 old_b $root/.old_tree $old
pack; echo "all done at $(( $(date +%s) - start )) s"
