#!/usr/bin/env bash
# One H200, NEW against OLD (.old_tree, its own extension build): the packed attention kernel's GPU tests at NEW;
# the kernel alone (web captions, 64 and 1,024 a call) new/old/old/new; ViT-L-14 caption batches through the
# packed text graphs new/old/old/new (the first pair profiled); then the patch's and graphs' GPU tests at NEW.
new=$1; old=$2; R=/tmp/rba; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ba.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log
root=$PWD
( cd .old_tree && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1; echo "rc=$?" >> $R/build_old.log ) &
builder=$!
pack() { ( cd $R && tar -czf $OUT/call_ba.tgz . ); }
CLIP_FLASH_GIT_REVISION=$new timeout 120 python3 -m pytest -q -p no:cacheprovider tests/ops/test_packed_attention_gpu.py tests/ops/test_binding_errors_gpu.py > $R/gpu_tests_attention_$new.log 2>&1; rc=$?
tail -n 3 $R/gpu_tests_attention_$new.log; echo "attention tests rc=$rc at $(( $(date +%s) - start )) s"
if [ $rc -ne 0 ]; then grep -E "Error|assert" $R/gpu_tests_attention_$new.log | head -20; pack; exit 1; fi
wait $builder; tail -n 2 $R/build_old.log; echo "old build done at $(( $(date +%s) - start )) s"
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 585 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
kernel() { run attention_$1 $2 $3 60 benchmarks/bench_packed_attention.py --batch-sizes 64 1024 --rounds 3 --json $R/attention_$1.json --markdown $R/attention_$1.md; grep -E "^\| (64|1024) " $R/attention_$1.md; }
text() { run text_$1 $2 $3 75 benchmarks/bench_text_batches.py --model ViT-L-14 --per-doubling 1 --grouping packed --batch-sizes 64 1024 --rounds 5 $4 --json $R/text_$1.json --markdown $R/text_$1.md; grep -E "^\| (64|1024) " $R/text_$1.md | cut -d'|' -f2,9; grep -E "^Encoder alone" $R/text_$1.md | cut -c1-110; grep -E "packed_attention_kernel|bias_act" $R/text_$1.md | head -2; }
kernel new_a $root $new; kernel old_a $root/.old_tree $old; kernel old_b $root/.old_tree $old; kernel new_b $root $new
text new_a $root $new "--profile-batch 1024"; text old_a $root/.old_tree $old "--profile-batch 1024"
text old_b $root/.old_tree $old ""; text new_b $root $new ""
now=$(date +%s); left=$(( 585 - (now - start) ))
if (( left > 60 )); then
  CLIP_FLASH_GIT_REVISION=$new timeout $left python3 -m pytest -q -p no:cacheprovider -m gpu tests/patching tests/graphs > $R/gpu_tests_patching_graphs_$new.log 2>&1; tail -n 3 $R/gpu_tests_patching_graphs_$new.log
fi
pack; echo "all done at $(( $(date +%s) - start )) s"
