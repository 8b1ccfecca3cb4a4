#!/usr/bin/env bash
# One H200 at NEW (pass the literal full hash): which attention kernels ViT-B-32's CUDA graphs run, and what each
# replay costs, without a table and with the measured H200 table (alternated twice); then the table measured again
# with padded captions at 8, 16, 32 and 77 tokens, and the graphs with that one.
new=$1; R=/tmp/rja; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ja.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
export CLIP_FLASH_GIT_REVISION=$new
T1=$PWD/benchmarks/results/h200/attention_table_5247172/measure_2325b10/nvidia-h200.json
pack() { ( cd $R && tar -czf $OUT/call_ja.tgz . ); }
run() {  # name limit env-assignment command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( timeout $limit env "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; grep -E "^\| text 1 x|^\| image 1 x|warning|rc=" $R/$name.log | cut -c1-160; pack
}
k() {  # label table-path
  run kernels_$1 90 CLIP_FLASH_ATTENTION_TABLE=$2 python3 benchmarks/graph_attention_kernels.py --model ViT-B-32 \
      --label $1 --json $R/kernels_$1.json --markdown $R/kernels_$1.md
}
k none_a ""; k table_a $T1; k none_b ""; k table_b $T1
run measure_seqs 240 X=1 python3 -m clip_flash.backends.measure_attention --text-seqs 8 16 32 77 --out $R/table_seqs/nvidia-h200.json
[ -f $R/table_seqs/nvidia-h200.json ] && k table2_a $R/table_seqs/nvidia-h200.json
pack; echo "all done at $(( $(date +%s) - start )) s"
