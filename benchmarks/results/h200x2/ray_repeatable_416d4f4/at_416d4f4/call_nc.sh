#!/usr/bin/env bash
# On the two-GPU machine at REV (literal full hash; carry .device and .device_ray): the repeatable-bits GPU tests,
# the patching and job GPU tests, then bench_embed_ray once (ViT-L-14 exact, 57,600 files: one-GPU job against Ray
# with one actor per GPU, rows compared). Issue 27: Ray at least 1.8x, rows bit-identical.
rev=$1; R=/tmp/rnc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_nc.sh $R/
tar -xJf .device_ray/ray_stripped.tar.xz -C /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile \
    --upgrade --target /tmp/site .device_ray/wheels/*.whl
nvidia-smi -L > $R/gpus.txt; nproc >> $R/gpus.txt
pack() { ( cd $R && tar -czf $OUT/call_nc.tgz . ); }
CLIP_FLASH_GIT_REVISION=$rev timeout 110 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/patching \
    tests/jobs/test_job_gpu.py > $R/gpu_tests_$rev.log 2>&1; echo "rc=$?" >> $R/gpu_tests_$rev.log
tail -n 3 $R/gpu_tests_$rev.log; echo "tests done at $(( $(date +%s) - start )) s"; pack
CLIP_FLASH_GIT_REVISION=$rev timeout 130 python3 benchmarks/bench_embed_ray.py --photos .device/photos --results $R/ray_a \
    --model ViT-L-14 --repeat 3600 > $R/ray_a.log 2>&1; echo "rc=$?" >> $R/ray_a.log
grep -E "^\| (clip|embed)|^Rows" $R/ray_a/embed_ray.md | cut -c1-250; pack; echo "all done at $(( $(date +%s) - start )) s"
