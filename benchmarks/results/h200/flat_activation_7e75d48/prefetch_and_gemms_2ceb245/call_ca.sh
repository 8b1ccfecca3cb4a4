#!/usr/bin/env bash
# One H200: NEW (packed attention requests the next key tile's k and v before the current tile's arithmetic,
# at most 168 registers) against OLD (HEAD before it) and VAR (the same prefetch held to 128 registers, spilling).
# The text tower's projections with and without cuBLAS's bias epilogue, at the default workspace and at 32 MiB.
# The attention call alone NEW/OLD/VAR/VAR/OLD/NEW; ViT-L-14 packed caption batches NEW/OLD.
new=$1; old=$2; var=$3; R=/tmp/rca; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ca.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
( cd .old_tree && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1; echo "rc=$?" >> $R/build_old.log ) &
b1=$!
( cd .var_tree && python3 setup.py -q build_ext --inplace > $R/build_var.log 2>&1; echo "rc=$?" >> $R/build_var.log ) &
b2=$!
pack() { ( cd $R && tar -czf $OUT/call_ca.tgz . ); }
strings $(python3 -c "import torch,os;print(os.path.join(os.path.dirname(torch.__file__),'lib','libtorch_cuda.so'))") | grep -E "^(TORCH_)?CUBLAS(LT)?_WORKSPACE" | sort -u > $R/torch_workspace_env.txt
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 590 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
gemms() { run gemms_$1 $root $new 60 benchmarks/bench_text_gemms.py --tokens $2 --json $R/gemms_$1.json --markdown $R/gemms_$1.md; grep -E "^\| (qkv|out|c_fc|c_proj|all)" $R/gemms_$1.md; }
gemms default_25600 25600
CUBLASLT_WORKSPACE_SIZE=32768 CUBLAS_WORKSPACE_CONFIG=:32768:2 gemms ws32m_25600 25600
gemms default_1600 1600
wait $b1 $b2; tail -n 1 $R/build_old.log $R/build_var.log; echo "builds done at $(( $(date +%s) - start )) s"
kernel() { run attention_$1 $2 $3 40 benchmarks/bench_packed_attention.py --batch-sizes 64 1024 --max-seqlens 77 --rounds 3 --json $R/attention_$1.json --markdown $R/attention_$1.md; grep -E "^\| (64|1024) " $R/attention_$1.md | cut -d'|' -f2,6,7; }
text() { run text_$1 $2 $3 75 benchmarks/bench_text_batches.py --model ViT-L-14 --per-doubling 1 --grouping packed --batch-sizes 64 1024 --rounds 5 $4 --json $R/text_$1.json --markdown $R/text_$1.md; grep -E "^\| (64|1024) " $R/text_$1.md | cut -d'|' -f2,9; }
kernel new_a $root $new; kernel old_a $root/.old_tree $old; kernel var_a $root/.var_tree $var
kernel var_b $root/.var_tree $var; kernel old_b $root/.old_tree $old; kernel new_b $root $new
text new_a $root $new; text old_a $root/.old_tree $old
pack; echo "all done at $(( $(date +%s) - start )) s"
