#!/usr/bin/env bash
# One H100 at NEW (full sha): the job's GPU tests; then fresh processes alternated: the decode="gpu" ViT-B-32 job over
# 57,600 files (photos384 x 150), 3 pairs, and the exact ViT-B-32 job over 7,680 files, 3 pairs, NEW against OLD
# (.old_tree: 6b16738, this session's start); a probe of NEW's start.
new=$1; old=$2; R=/tmp/raq; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_aq.sh $R/; cp clip_flash/_C*.so .old_tree/clip_flash/
rm -rf /tmp/photos384 && cp -r .device/photos384 /tmp/photos384
CLIP_FLASH_GIT_REVISION=$new timeout 150 python3 -m pytest -q -p no:cacheprovider tests/jobs/test_job_gpu.py tests/jobs/test_device_ahead.py tests/jobs/test_beside_load.py tests/jobs/test_gpu_decoders_ahead.py tests/jobs/test_pinned_reserve_gpu.py > $R/gpu_tests_$new.log 2>&1; tail -n 3 $R/gpu_tests_$new.log
echo "tests done at $(( $(date +%s) - start )) s"
root=$PWD
job() {  # name tree rev model repeat case
  now=$(date +%s); if (( now - start > 530 )); then echo "skip $1"; return; fi
  ( cd $2 && CLIP_FLASH_GIT_REVISION=$3 PYTHONPATH=/tmp/site:$2 timeout 90 python3 benchmarks/bench_embed.py --photos /tmp/photos384 --models $4 --repeat $5 --cases $6 --no-stock --captions 0 --encoder-calls 5 --results $R/$1 > $R/$1.log 2>&1; echo "rc=$?" >> $R/$1.log )
  grep -hE "^\| ViT" $R/$1/*.md | cut -d'|' -f4-14 | tr -s ' '; echo "$1 done at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_aq.tgz . )
}
job gpu_b32_new_a $root $new ViT-B-32 150 gpu-decode; job gpu_b32_old_a $root/.old_tree $old ViT-B-32 150 gpu-decode
job exact_b32_new_a $root $new ViT-B-32 20 exact-native; job exact_b32_old_a $root/.old_tree $old ViT-B-32 20 exact-native
job gpu_b32_old_b $root/.old_tree $old ViT-B-32 150 gpu-decode; job gpu_b32_new_b $root $new ViT-B-32 150 gpu-decode
job exact_b32_old_b $root/.old_tree $old ViT-B-32 20 exact-native; job exact_b32_new_b $root $new ViT-B-32 20 exact-native
job gpu_b32_new_c $root $new ViT-B-32 150 gpu-decode; job gpu_b32_old_c $root/.old_tree $old ViT-B-32 150 gpu-decode
job exact_b32_new_c $root $new ViT-B-32 20 exact-native; job exact_b32_old_c $root/.old_tree $old ViT-B-32 20 exact-native
now=$(date +%s); if (( now - start < 540 )); then
  CLIP_FLASH_GIT_REVISION=$new timeout $(( 590 - (now - start) )) python3 benchmarks/probe_job_start.py --photos /tmp/photos384 --model ViT-L-14 --repeat 20 --capture default --json $R/probe_l14_new.json --markdown $R/probe_l14_new.md > $R/probe_l14_new.log 2>&1; tail -n 22 $R/probe_l14_new.md
fi
( cd $R && tar -czf $OUT/call_aq.tgz . )
