#!/usr/bin/env bash
# One H200: NEW (bias_act over contiguous matrices as one flat array of packs) against OLD (2ab4149, the
# column-group kernel; the same bench_activation.py copied in), each tree with its own extension. Fused-op GPU
# tests at NEW; the activation pass NEW/OLD/OLD/NEW at text-tower and vision shapes; ViT-L-14 packed caption
# batches NEW/OLD/NEW32/NEW32/OLD/NEW (NEW32: 32 token buckets a doubling instead of 16).
new=$1; old=$2; R=/tmp/rcc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_cc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
( cd .old_tree && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1; echo "rc=$?" >> $R/build_old.log ) &
b1=$!
pack() { ( cd $R && tar -czf $OUT/call_cc.tgz . ); }
CLIP_FLASH_GIT_REVISION=$new timeout 120 python3 -m pytest -q -p no:cacheprovider tests/ops/test_fused_ops.py -m gpu > $R/gpu_tests_fused_ops_$new.log 2>&1; rc=$?
tail -n 3 $R/gpu_tests_fused_ops_$new.log; echo "tests rc=$rc at $(( $(date +%s) - start )) s"
if [ $rc -ne 0 ]; then grep -E "Error|assert|FAILED" $R/gpu_tests_fused_ops_$new.log | head -20; pack; exit 1; fi
wait $b1; tail -n 1 $R/build_old.log; echo "build done at $(( $(date +%s) - start )) s"
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 590 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
act() { run activation_text_$1 $2 $3 40 benchmarks/bench_activation.py --models ViT-L-14-text ViT-B-32-text --batch-sizes 64 1024 --activations gelu quick_gelu --json $R/activation_text_$1.json --markdown $R/activation_text_$1.md; grep -E "^\| ViT" $R/activation_text_$1.md | cut -d'|' -f2-10
        run activation_vision_$1 $2 $3 40 benchmarks/bench_activation.py --models ViT-L-14 ViT-B-16 --batch-sizes 64 256 --activations gelu quick_gelu --json $R/activation_vision_$1.json --markdown $R/activation_vision_$1.md; grep -E "^\| ViT" $R/activation_vision_$1.md | cut -d'|' -f2-10; }
text() { run text_$1 $2 $3 75 benchmarks/bench_text_batches.py --model ViT-L-14 --per-doubling 1 --grouping packed --batch-sizes 64 1024 --rounds 5 $4 --json $R/text_$1.json --markdown $R/text_$1.md; grep -E "^\| (64|1024) " $R/text_$1.md | cut -d'|' -f2,9; }
act new_a $root $new; act old_a $root/.old_tree $old; act old_b $root/.old_tree $old; act new_b $root $new
text new_a $root $new ""; text old_a $root/.old_tree $old ""; text new32_a $root $new "--packed-per-doubling 32"
text new32_b $root $new "--packed-per-doubling 32"; text old_b $root/.old_tree $old ""; text new_b $root $new ""
pack; echo "all done at $(( $(date +%s) - start )) s"
