#!/usr/bin/env bash
# One H200, NEW against OLD (.old_tree, full shas): the patch's GPU tests at NEW; then fresh processes alternated:
# ViT-L-14 caption batches through the packed text graphs (web captions, 64 and 1,024 a batch), new/old/new/old;
# the image towers (ViT-L-14 batch 64/256, ViT-B-32 batch 256), new/old/new/old.
new=$1; old=$2; R=/tmp/rat; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_at.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp clip_flash/_C*.so .old_tree/clip_flash/
CLIP_FLASH_GIT_REVISION=$new timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/patching tests/graphs > $R/gpu_tests_patching_graphs_$new.log 2>&1; tail -n 3 $R/gpu_tests_patching_graphs_$new.log
echo "tests done at $(( $(date +%s) - start )) s"
root=$PWD
pack() { ( cd $R && tar -czf $OUT/call_at.tgz . ); }
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 585 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
text() { run text_$1 $2 $3 75 benchmarks/bench_text_batches.py --model ViT-L-14 --per-doubling 1 --grouping packed --batch-sizes 64 1024 --rounds 5 $4 --json $R/text_$1.json --markdown $R/text_$1.md; grep -E "^\| (64|1024) " $R/text_$1.md | cut -d'|' -f2,9; grep -iE "alone" $R/text_$1.md | head -2; }
image() { run image_$1 $2 $3 60 benchmarks/bench_clip.py --model $4 --towers image --batch-sizes $5 --times 30 --json $R/image_$1.json --markdown $R/image_$1.md; grep -E "^\| *image" $R/image_$1.md | head -4; }
text new_a $root $new "--profile-batch 1024"; text old_a $root/.old_tree $old "--profile-batch 1024"
image l14_new_a $root $new ViT-L-14 "64 256"; image l14_old_a $root/.old_tree $old ViT-L-14 "64 256"
image b32_new_a $root $new ViT-B-32 256; image b32_old_a $root/.old_tree $old ViT-B-32 256
text old_b $root/.old_tree $old ""; text new_b $root $new ""
image l14_old_b $root/.old_tree $old ViT-L-14 "64 256"; image l14_new_b $root $new ViT-L-14 "64 256"
image b32_old_b $root/.old_tree $old ViT-B-32 256; image b32_new_b $root $new ViT-B-32 256
pack; echo "all done at $(( $(date +%s) - start )) s"
