#!/usr/bin/env bash
# One H100 at REV: Ray made importable, then the Ray GPU test (one actor on the GPU) and the job's GPU tests.
rev=$1; R=/tmp/rah; rm -rf $R; mkdir -p $R
cp .device/call_ah.sh $R/
tar -xJf .device_ray/ray_stripped.tar.xz -C /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .device_ray/wheels/*.whl
CLIP_FLASH_GIT_REVISION=$rev timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/jobs/test_job_ray_gpu.py tests/jobs/test_job_gpu.py tests/jobs/test_device_ahead.py > $R/gpu_tests_ray_$rev.log 2>&1; tail -n 3 $R/gpu_tests_ray_$rev.log
( cd $R && tar -czf $OUT/call_ah.tgz . )
