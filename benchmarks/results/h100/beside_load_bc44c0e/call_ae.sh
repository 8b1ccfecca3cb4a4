#!/usr/bin/env bash
# One H100, at NEW (full sha) with OLD's tree (7217079) in .old_tree (same csrc: the built extension is copied):
# GPU tests of the job (threads beside the model load, warm-up steps, shard stream), then the exact embedding job
# over 7,680 files (photos384 x 20): ViT-B-32 new, old, new, old, ViT-L-14 new, old.
new=$1; old=$2; R=/tmp/rae; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ae.sh $R/; cp clip_flash/_C*.so .old_tree/clip_flash/
rm -rf /tmp/photos384 && cp -r .device/photos384 /tmp/photos384
CLIP_FLASH_GIT_REVISION=$new timeout 150 python3 -m pytest -q tests/jobs/test_job_gpu.py tests/jobs/test_pinned_reserve_gpu.py tests/jobs/test_gpu_decoders_ahead.py tests/jobs/test_inputs_ahead.py tests/jobs/test_shard_stream.py > $R/gpu_tests_jobs_$new.log 2>&1; tail -n 2 $R/gpu_tests_jobs_$new.log
root=$PWD
job() {  # name tree rev model
  now=$(date +%s); if (( now - start > 520 )); then echo "skip $1"; return; fi
  ( cd $2 && CLIP_FLASH_GIT_REVISION=$3 PYTHONPATH=/tmp/site:$2 timeout 90 python3 benchmarks/bench_embed.py --photos /tmp/photos384 --models $4 --repeat 20 --cases exact-native --no-stock --captions 0 --encoder-calls 5 --results $R/$1 > $R/$1.log 2>&1; echo "rc=$?" >> $R/$1.log )
  grep -E "^\| ViT" $R/$1/*.md | cut -c1-400; grep -h "device warm-up:" $R/$1.log; echo "$1 done at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_ae.tgz . )
}
job exact_b32_new_a $root $new ViT-B-32
job exact_b32_old_a $root/.old_tree $old ViT-B-32
job exact_b32_new_b $root $new ViT-B-32
job exact_b32_old_b $root/.old_tree $old ViT-B-32
job exact_l14_new_a $root $new ViT-L-14
job exact_l14_old_a $root/.old_tree $old ViT-L-14
