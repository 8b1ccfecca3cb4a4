#!/usr/bin/env bash
# One H200: NEW (heads-adjacent attention grid + bias_act by table) against VAR (the register attention kernel
# with the sequence-major grid, 5856afa) and OLD (982c9fd, the shared-memory attention kernel, per-element
# bias_act), each tree with its own extension build. GPU tests of the two kernels at NEW; the attention call
# alone NEW/VAR/VAR/NEW; the activation pass NEW/OLD/OLD/NEW; ViT-L-14 packed caption batches NEW/OLD/OLD/NEW
# (first pair profiled); the server at 64 captions a request, fresh servers NEW then OLD.
new=$1; var=$2; old=$3; R=/tmp/rbb; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_bb.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log
root=$PWD
( cd .old_tree && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1; echo "rc=$?" >> $R/build_old.log ) &
b1=$!
( cd .var_tree && python3 setup.py -q build_ext --inplace > $R/build_var.log 2>&1; echo "rc=$?" >> $R/build_var.log ) &
b2=$!
pack() { ( cd $R && tar -czf $OUT/call_bb.tgz . ); }
CLIP_FLASH_GIT_REVISION=$new timeout 150 python3 -m pytest -q -p no:cacheprovider tests/ops/test_packed_attention_gpu.py tests/ops/test_binding_errors_gpu.py tests/ops/test_fused_ops.py -m gpu > $R/gpu_tests_ops_$new.log 2>&1; rc=$?
tail -n 3 $R/gpu_tests_ops_$new.log; echo "ops tests rc=$rc at $(( $(date +%s) - start )) s"
if [ $rc -ne 0 ]; then grep -E "Error|assert|FAILED" $R/gpu_tests_ops_$new.log | head -20; pack; exit 1; fi
wait $b1 $b2; tail -n 1 $R/build_old.log $R/build_var.log; echo "builds done at $(( $(date +%s) - start )) s"
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 590 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
kernel() { run attention_$1 $2 $3 40 benchmarks/bench_packed_attention.py --batch-sizes 64 1024 --max-seqlens 77 --rounds 3 --json $R/attention_$1.json --markdown $R/attention_$1.md; grep -E "^\| (64|1024) " $R/attention_$1.md | cut -d'|' -f2,6,7; }
act() { run activation_$1 $2 $3 40 benchmarks/bench_activation.py --models ViT-L-14 ViT-B-16 --batch-sizes 64 256 --activations gelu quick_gelu --json $R/activation_$1.json --markdown $R/activation_$1.md; grep -E "^\| ViT" $R/activation_$1.md | cut -d'|' -f2-6; }
text() { run text_$1 $2 $3 75 benchmarks/bench_text_batches.py --model ViT-L-14 --per-doubling 1 --grouping packed --batch-sizes 64 1024 --rounds 5 $4 --json $R/text_$1.json --markdown $R/text_$1.md; grep -E "^\| (64|1024) " $R/text_$1.md | cut -d'|' -f2,9; grep -E "packed_attention_kernel|bias_act|activation_by_table" $R/text_$1.md | cut -c1-140 | head -3; }
serve() { run serve_$1 $2 $3 120 benchmarks/serve/bench_serve.py --configs clip_flash --workloads captions64 --no-wrk --photos $root/.device/photos --rates 1400,1500,1600,1700 --duration 8 --results $R/serve_$1; grep -E "^\| *1,[4-7]00 " $R/serve_$1/serve_bench.md | cut -d'|' -f2-9 | head -5; }
kernel new_a $root $new; kernel var_a $root/.var_tree $var; kernel var_b $root/.var_tree $var; kernel new_b $root $new
act new_a $root $new; act old_a $root/.old_tree $old; act old_b $root/.old_tree $old; act new_b $root $new
text new_a $root $new "--profile-batch 1024"; text old_a $root/.old_tree $old "--profile-batch 1024"
text old_b $root/.old_tree $old ""; text new_b $root $new ""
serve new_a $root $new; serve old_a $root/.old_tree $old
pack; echo "all done at $(( $(date +%s) - start )) s"
