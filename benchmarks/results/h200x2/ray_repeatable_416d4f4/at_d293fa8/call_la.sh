#!/usr/bin/env bash
# On the two-GPU machine (nvidia-h200-x2) at REV (pass the literal full hash; carry .device and .device_ray):
# Ray made importable from the carried stripped tree; what the machine has; the Ray GPU tests; then
# bench_embed_ray (ViT-L-14 exact, 57,600 files: the one-GPU job, then Ray with one actor per GPU, rows compared)
# twice, fresh processes. Issue 27's target: Ray at least 1.8x the one-GPU job, rows bit-identical.
rev=$1; R=/tmp/rla; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_la.sh $R/
tar -xJf .device_ray/ray_stripped.tar.xz -C /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile \
    --upgrade --target /tmp/site .device_ray/wheels/*.whl
nvidia-smi -L > $R/gpus.txt; nproc >> $R/gpus.txt; nvidia-smi topo -m > $R/topo.txt 2>&1
python3 -c "import torch, ray, ray.data, pyarrow; print('gpus', torch.cuda.device_count(), 'ray', ray.__version__, 'pyarrow', pyarrow.__version__)
try:
    import pandas; print('pandas', pandas.__version__)
except ImportError as e: print('no pandas', e)" > $R/imports.txt 2>&1; cat $R/imports.txt
echo "ray ready at $(( $(date +%s) - start )) s"
pack() { ( cd $R && tar -czf $OUT/call_la.tgz . ); }
CLIP_FLASH_GIT_REVISION=$rev timeout 150 python3 -m pytest -q -p no:cacheprovider tests/jobs/test_job_ray_gpu.py > $R/gpu_tests_ray_$rev.log 2>&1
tail -n 2 $R/gpu_tests_ray_$rev.log; pack
for run in a b; do
  now=$(date +%s); if (( now - start + 180 > 590 )); then echo "skip $run"; continue; fi
  CLIP_FLASH_GIT_REVISION=$rev timeout 180 python3 benchmarks/bench_embed_ray.py --photos .device/photos --results $R/ray_$run \
      --model ViT-L-14 --repeat 3600 > $R/ray_$run.log 2>&1; echo "rc=$?" >> $R/ray_$run.log
  echo "== $run"; grep -E "^\| (clip|embed)|^- embed|^Rows" $R/ray_$run/embed_ray.md; echo "at $(( $(date +%s) - start )) s"; pack
done
pack; echo "all done at $(( $(date +%s) - start )) s"
