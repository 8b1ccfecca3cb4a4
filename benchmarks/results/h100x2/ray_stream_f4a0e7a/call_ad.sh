#!/usr/bin/env bash
# On the two-GPU machine, at REV (full sha) against OLD (.old_tree, its clip_flash/_C*.so copied in): Ray made
# importable; the Ray GPU tests at REV; then bench_embed_ray (ViT-L-14 exact, 57,600 files) new / old / new.
rev=$1; R=/tmp/rad; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ad.sh $R/
tar -xJf .device_ray/ray_stripped.tar.xz -C /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .device_ray/wheels/*.whl
cp clip_flash/_C*.so .old_tree/clip_flash/ 2>/dev/null
nvidia-smi -L > $R/gpus.txt; nproc >> $R/gpus.txt; echo "ray ready at $(( $(date +%s) - start )) s"
CLIP_FLASH_GIT_REVISION=$rev timeout 150 python3 -m pytest -q tests/jobs/test_job_ray_gpu.py tests/jobs/test_shard_stream.py > $R/gpu_tests_$rev.log 2>&1; tail -n 2 $R/gpu_tests_$rev.log
for run in new_a old_a new_b; do
  if [[ $run == old* ]]; then tree=.old_tree; r=$OLDREV; else tree=$PWD; r=$rev; fi
  ( cd $tree && PYTHONPATH=/tmp/site:$tree CLIP_FLASH_GIT_REVISION=$r timeout 170 python3 benchmarks/bench_embed_ray.py --photos $OLDPWD/.device/photos --results $R/ray_$run --model ViT-L-14 --repeat 3600 > $R/ray_$run.log 2>&1; echo "rc=$?" >> $R/ray_$run.log )
  echo "== $run"; grep -E "^\| (clip|embed)|^- embed|^Rows" $R/ray_$run/embed_ray.md; echo "at $(( $(date +%s) - start )) s"
done
( cd $R && tar -czf $OUT/call_ad.tgz . )
