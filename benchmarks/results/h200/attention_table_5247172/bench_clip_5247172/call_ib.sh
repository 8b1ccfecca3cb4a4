#!/usr/bin/env bash
# One H200 at NEW: the fixed fp16-stock GPU test, then the H200 attention table A/B: bench_clip with no table
# (auto = torch's SDPA pick) and with the table measured in call_ia (CLIP_FLASH_ATTENTION_TABLE), alternated.
new=$1; R=/tmp/rib; rm -rf $R; mkdir -p $R/ab; start=$(date +%s)
cp .device/call_ib.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
pack() { ( cd $R && tar -czf $OUT/call_ib.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( CLIP_FLASH_GIT_REVISION=$new timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run gpu_test_no_cudnn 150 python3 -m pytest -q -rs tests/serve/test_serve_gpu.py -k "no_cudnn"
tail -2 $R/gpu_test_no_cudnn.log
TABLE=$PWD/.device/exp/h200_table.json
for k in a b; do for side in none table; do
  if [ $side = table ]; then envs="CLIP_FLASH_ATTENTION_TABLE=$TABLE"; else envs="CLIP_FLASH_ATTENTION_TABLE="; fi
  run b32_graphs_${side}_$k 90 env $envs python3 benchmarks/bench_clip.py --model ViT-B-32 --cuda-graphs \
      --batch-sizes 1 16 256 --graph-batch-sizes 1 16 256 --times 100 \
      --json $R/ab/b32_graphs_${side}_$k.json --markdown $R/ab/b32_graphs_${side}_$k.md
  run l14_eager_${side}_$k 90 env $envs python3 benchmarks/bench_clip.py --model ViT-L-14 \
      --batch-sizes 1 4 16 --times 100 \
      --json $R/ab/l14_eager_${side}_$k.json --markdown $R/ab/l14_eager_${side}_$k.md
done; done
pack; echo "all done at $(( $(date +%s) - start )) s"
