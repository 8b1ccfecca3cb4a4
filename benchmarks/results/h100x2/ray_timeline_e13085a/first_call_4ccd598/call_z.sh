#!/usr/bin/env bash
# On the two-GPU machine, at REV (full sha): Ray (carried stripped in .device_ray) made importable; the Ray job's
# tests; the embedding job on one GPU against embed_with_ray on both (ViT-L-14 exact, 57,600 files: the 16 photos
# 3,600 times), twice.
rev=$1; export CLIP_FLASH_GIT_REVISION=$rev; short=${rev:0:7}; R=/tmp/rz; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_z.sh $R/
tar -xJf .device_ray/ray_stripped.tar.xz -C /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .device_ray/wheels/*.whl
python3 -c "import ray, ray.data; print('ray', ray.__version__)" 2>&1 | tail -n 2; nvidia-smi -L > $R/gpus.txt; nproc >> $R/gpus.txt
echo "ray ready at $(( $(date +%s) - start )) s"
timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/jobs/test_job_ray_gpu.py tests/jobs/test_job_ray.py > $R/gpu_tests_ray_$short.log 2>&1; echo "rc=$?" >> $R/gpu_tests_ray_$short.log
tail -n 3 $R/gpu_tests_ray_$short.log; echo "tests done at $(( $(date +%s) - start )) s"
( cd $R && tar -czf $OUT/call_z.tgz . )
for run in a b; do
  now=$(date +%s); if (( now - start > 420 )); then echo "skip $run"; continue; fi
  timeout 170 python3 benchmarks/bench_embed_ray.py --photos .device/photos --results $R/ray_$run --model ViT-L-14 --repeat 3600 > $R/ray_$run.log 2>&1; echo "rc=$?" >> $R/ray_$run.log
  grep -E "^\| (clip|embed)|^- embed|^Rows" $R/ray_$run/embed_ray.md; tail -n 3 $R/ray_$run.log; echo "ray $run done at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_z.tgz . )
done
