#!/usr/bin/env bash
# One H100, at NEW (full sha) with OLD's tree in .old_tree (same csrc: the built extension is copied): GPU tests of
# the job and the stand-ins, then the exact embedding job over 7,680 files (photos384 x 20) ViT-L-14 (4 pairs) and
# ViT-B-32 (1 pair), new and old alternated (the stand-in run again by the warm-up on the launching thread or not:
# .old_tree = ffc7aa9, whose bench_embed.py measures the encoder-only ceiling after the job, as NEW's does).
new=$1; old=$2; R=/tmp/rao; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ao.sh $R/; cp clip_flash/_C*.so .old_tree/clip_flash/
rm -rf /tmp/photos384 && cp -r .device/photos384 /tmp/photos384
CLIP_FLASH_GIT_REVISION=$new timeout 120 python3 -m pytest -q -p no:cacheprovider tests/jobs/test_job_gpu.py tests/jobs/test_device_ahead.py > $R/gpu_tests_$new.log 2>&1; tail -n 3 $R/gpu_tests_$new.log
echo "tests done at $(( $(date +%s) - start )) s"
root=$PWD
job() {  # name tree rev model repeat case
  now=$(date +%s); if (( now - start > 520 )); then echo "skip $1"; return; fi
  ( cd $2 && CLIP_FLASH_GIT_REVISION=$3 PYTHONPATH=/tmp/site:$2 timeout 90 python3 benchmarks/bench_embed.py --photos /tmp/photos384 --models $4 --repeat $5 --cases $6 --no-stock --captions 0 --encoder-calls 5 --results $R/$1 > $R/$1.log 2>&1; echo "rc=$?" >> $R/$1.log )
  grep -hE "^\| ViT" $R/$1/*.md | cut -d'|' -f4-14 | tr -s ' '; grep -hE "device warm-up:|beside the model load:" $R/$1.log; echo "$1 done at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_ao.tgz . )
}
for p in a b c d; do job exact_l14_new_$p $root $new ViT-L-14 20 exact-native; job exact_l14_old_$p $root/.old_tree $old ViT-L-14 20 exact-native; done
job exact_b32_new_a $root $new ViT-B-32 20 exact-native; job exact_b32_old_a $root/.old_tree $old ViT-B-32 20 exact-native
( cd $R && tar -czf $OUT/call_ao.tgz . )
