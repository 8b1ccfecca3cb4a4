#!/usr/bin/env bash
# On the two-GPU machine, at NEW (full sha) against OLD (.old_tree, its clip_flash/_C*.so copied in): Ray made
# importable; the Ray GPU test and the job's GPU tests at NEW; then bench_embed_ray (ViT-L-14 exact, 57,600 files)
# new / old / new.
new=$1; old=$2; R=/tmp/rar; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ar.sh $R/
tar -xJf .device_ray/ray_stripped.tar.xz -C /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .device_ray/wheels/*.whl
cp clip_flash/_C*.so .old_tree/clip_flash/ 2>/dev/null
nvidia-smi -L > $R/gpus.txt; nproc >> $R/gpus.txt; echo "ray ready at $(( $(date +%s) - start )) s"
CLIP_FLASH_GIT_REVISION=$new timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/jobs/test_job_ray_gpu.py tests/jobs/test_shard_stream.py tests/jobs/test_job_gpu.py tests/jobs/test_device_ahead.py > $R/gpu_tests_ray_$new.log 2>&1; tail -n 3 $R/gpu_tests_ray_$new.log
echo "tests done at $(( $(date +%s) - start )) s"
for run in new_a old_a new_b; do
  now=$(date +%s); if (( now - start > 420 )); then echo "skip $run"; continue; fi
  if [[ $run == old* ]]; then tree=$PWD/.old_tree; r=$old; else tree=$PWD; r=$new; fi
  ( cd $tree && PYTHONPATH=/tmp/site:$tree CLIP_FLASH_GIT_REVISION=$r timeout 170 python3 benchmarks/bench_embed_ray.py --photos $OLDPWD/.device/photos --results $R/ray_$run --model ViT-L-14 --repeat 3600 > $R/ray_$run.log 2>&1; echo "rc=$?" >> $R/ray_$run.log )
  echo "== $run"; grep -E "^\| (clip|embed)|^- embed|^Rows" $R/ray_$run/embed_ray.md; echo "at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_ar.tgz . )
done
( cd $R && tar -czf $OUT/call_ar.tgz . )
