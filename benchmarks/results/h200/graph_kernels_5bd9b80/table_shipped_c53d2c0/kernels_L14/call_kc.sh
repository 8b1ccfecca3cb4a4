#!/usr/bin/env bash
# One H200 at NEW (the H200 attention table shipped): which attention kernels ViT-L-14's caption CUDA graphs run and
# their device time, with the table and without it (the file moved away), alternated while time is left.
new=$1; R=/tmp/rkc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_kc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
T=clip_flash/backends/attention_tables/nvidia-h200.json
export CLIP_FLASH_GIT_REVISION=$new
pack() { ( cd $R && tar -czf $OUT/call_kc.tgz . ); }
k() {  # side_k
  local side=${1%_*}; now=$(date +%s); if (( now - start + 70 > 300 )); then echo "skip $1"; return; fi
  [ $side = none ] && mv $T /tmp/h200_table.json
  (timeout 70 python3 benchmarks/graph_attention_kernels.py --model ViT-L-14 --label $1 --text-rows 1 16 32 48 64 \
      --text-lengths 8 16 32 77 --image-rows 1 --json $R/kernels_L14_$1.json --markdown $R/kernels_L14_$1.md \
      > $R/kernels_L14_$1.log 2>&1; echo "rc=$?" >> $R/kernels_L14_$1.log)
  [ $side = none ] && mv /tmp/h200_table.json $T
  tail -n 1 $R/kernels_L14_$1.log; echo "$1 done at $(( $(date +%s) - start )) s"; pack
}
k table_a; k none_a; k none_b; k table_b
pack; echo "all done at $(( $(date +%s) - start )) s"
