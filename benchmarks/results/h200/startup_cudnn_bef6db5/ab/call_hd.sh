#!/usr/bin/env bash
# One H200: OLD (HEAD, cuDNN attention as torch picks it) start-up profile with and without cuDNN attention for
# ViT-L-14 and ViT-B-32 (image and caption replay times beside), then NEW (the engine turns cuDNN attention off)
# and OLD servers alternated: ViT-L-14 one JPEG and 64 captions a request, ViT-B-32 --decode gpu one JPEG.
new=$1; old=$2; R=/tmp/rhd; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_hd.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
( cd .old_tree && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1 ); echo "old built at $(( $(date +%s) - start )) s"
pack() { ( cd $R && tar -czf $OUT/call_hd.tgz . ); }
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
run startup_L14 $root/.old_tree $old 150 benchmarks/serve/startup_profile.py --model ViT-L-14 --variant as-is no-cudnn-attention --results $R/startup_L14
grep -E "^## |^Image graph|^Padded|^\| (build|capture|time)" $R/startup_L14.log
run startup_B32 $root/.old_tree $old 90 benchmarks/serve/startup_profile.py --model ViT-B-32 --variant as-is no-cudnn-attention --results $R/startup_B32
grep -E "^## |^Image graph|^Padded|^\| (build|capture|time)" $R/startup_B32.log
srv() { run L14_$1 $2 $3 130 benchmarks/serve/bench_serve.py --configs clip_flash --workloads image-raw,captions64 --no-wrk --photos $root/.device/photos --start-rps image-raw=2400,captions64=1400 --factor 1.1 --refine 1 --duration 3 --warmup 1 --results $R/L14_$1; grep -E "^\*\*|Ready after" $R/L14_$1/serve_bench.md | cut -c1-160; }
b32() { run B32_$1 $2 $3 60 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk --photos $root/.device/photos --rates 8200,9000 --duration 3 --results $R/B32_$1; grep -E "^\| *[89],[0-9]00\.0 \| [0-9]|Ready after" $R/B32_$1/serve_bench.md | cut -c1-160; }
srv new_a $root $new; srv old_a $root/.old_tree $old; b32 new_a $root $new; b32 old_a $root/.old_tree $old
pack; echo "all done at $(( $(date +%s) - start )) s"
