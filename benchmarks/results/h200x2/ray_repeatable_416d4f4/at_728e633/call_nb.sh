#!/usr/bin/env bash
# On the two-GPU machine (nvidia-h200-x2) at REV (literal full hash; carry .device and .device_ray): Ray from the
# carried tree; the jobs' GPU tests (the job's rows against unpipelined batches with the graph kept, dropped and
# not asked for; the Ray actor's rows); then bench_embed_ray (ViT-L-14 exact, 57,600 files: the one-GPU job, then
# Ray with one actor per GPU, rows compared) once. Issue 27: Ray at least 1.8x the one-GPU job, rows bit-identical.
rev=$1; R=/tmp/rnb; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_nb.sh $R/
tar -xJf .device_ray/ray_stripped.tar.xz -C /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile \
    --upgrade --target /tmp/site .device_ray/wheels/*.whl
nvidia-smi -L > $R/gpus.txt; nproc >> $R/gpus.txt
pack() { ( cd $R && tar -czf $OUT/call_nb.tgz . ); }
CLIP_FLASH_GIT_REVISION=$rev timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/jobs/test_job_gpu.py \
    tests/jobs/test_job_ray_gpu.py > $R/gpu_tests_jobs_$rev.log 2>&1; echo "rc=$?" >> $R/gpu_tests_jobs_$rev.log
tail -n 3 $R/gpu_tests_jobs_$rev.log; echo "tests done at $(( $(date +%s) - start )) s"; pack
for run in a b; do
  now=$(date +%s); if (( now - start + 150 > 590 )); then echo "skip $run"; continue; fi
  CLIP_FLASH_GIT_REVISION=$rev timeout 170 python3 benchmarks/bench_embed_ray.py --photos .device/photos --results $R/ray_$run \
      --model ViT-L-14 --repeat 3600 > $R/ray_$run.log 2>&1; echo "rc=$?" >> $R/ray_$run.log
  echo "== $run"; grep -E "^\| (clip|embed)|^Rows" $R/ray_$run/embed_ray.md | cut -c1-250; echo "at $(( $(date +%s) - start )) s"; pack
  [ $run = a ] && (( $(date +%s) - start > 260 )) && break
done
pack; echo "all done at $(( $(date +%s) - start )) s"
