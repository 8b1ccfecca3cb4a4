#!/usr/bin/env bash
# One H200 at HEAD: the fused-op GPU tests; ViT-L-14 packed caption graphs against the eager encoder, profiled
# kernel by kernel at 1,024 captions a batch.
new=$1; R=/tmp/rda; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_da.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
pack() { ( cd $R && tar -czf $OUT/call_da.tgz . ); }
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 590 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run text_profile $root $new 200 benchmarks/bench_text_batches.py --model ViT-L-14 --per-doubling 1 --grouping packed --batch-sizes 64 1024 --rounds 5 --profile-batch 1024 --json $R/text_profile.json --markdown $R/text_profile.md
grep -E "^\| (64|1024) " $R/text_profile.md | cut -d'|' -f2,9
run gpu_tests_fused_ops_$new $root $new 240 -m pytest -m gpu -q tests/ops/test_fused_ops.py
tail -n 3 $R/gpu_tests_fused_ops_$new.log
pack; echo "all done at $(( $(date +%s) - start )) s"
