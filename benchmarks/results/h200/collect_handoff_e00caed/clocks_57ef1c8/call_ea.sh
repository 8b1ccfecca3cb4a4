#!/usr/bin/env bash
# One H200 at NEW: the caption graphs' clocks (NVML) with and without idle gaps; the server's and the packed
# caption graphs' GPU tests.
new=$1; R=/tmp/rea; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ea.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
pack() { ( cd $R && tar -czf $OUT/call_ea.tgz . ); }
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run text_clocks $root $new 190 benchmarks/bench_text_batches.py --model ViT-L-14 --per-doubling 1 --grouping packed --batch-sizes 64 1024 --rounds 5 --profile-batch 1024 --profile-gap-ms 8 --json $R/text_clocks.json --markdown $R/text_clocks.md
grep -iE "clock|MHz|power|W " $R/text_clocks.md | head -20
run gpu_tests_serve_$new $root $new 280 -m pytest -q -rs -p no:cacheprovider -m gpu tests/serve/test_serve_gpu.py
tail -n 3 $R/gpu_tests_serve_$new.log; grep -E "FAILED|ERROR" $R/gpu_tests_serve_$new.log | head
run gpu_tests_packed_$new $root $new 90 -m pytest -q -rs -p no:cacheprovider -m gpu tests/graphs/test_packed_text_gpu.py
tail -n 3 $R/gpu_tests_packed_$new.log
pack; echo "all done at $(( $(date +%s) - start )) s"
