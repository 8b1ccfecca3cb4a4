#!/usr/bin/env bash
# One H200 at REV (literal full hash): back_to_back_ms through median_cuda_ms (8c3dcd0) on the GPU for the first
# time: GPU tests of backends/graphs/benchmarks; ViT-L-14 caption graphs' kernels with the shipped table (the same
# arguments as call_ma's kernels_L14_table); the L-14 engine's text replay costs re-timed (startup_profile).
rev=$1; R=/tmp/rna; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_na.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_na.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 585 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  tail -n 1 $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
python3 -m clip_flash.info > $R/info.txt 2>&1
run gpu_tests 150 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/backends tests/graphs tests/benchmarks
tail -n 2 $R/gpu_tests.log
run kernels_L14_table 80 python3 benchmarks/graph_attention_kernels.py --model ViT-L-14 --label table \
    --text-rows 1 16 32 48 64 --text-lengths 8 16 32 77 --image-rows 1 --json $R/kernels_L14_table.json \
    --markdown $R/kernels_L14_table.md
run startup_L14 90 python3 benchmarks/serve/startup_profile.py --model ViT-L-14 --retime-text --results $R/startup_L14
grep -E "^Padded text" $R/startup_L14/startup_profile.md
pack; echo "all done at $(( $(date +%s) - start )) s"
