# Device run M: the Ray path on one GPU. Ray 2.60.0 travels as a wheel without its Java jars (ray/jars: Java
# workers only; the whole wheel is 79 MB, over a run's 64 MiB), with jsonschema and its deps (not on the machine).
export SKIP_EXT_BUILD=1 CLIP_FLASH_CACHE=$PWD/build/cf_jit CLIP_FLASH_GIT_REVISION=$1
source .device/setup.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_ray .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site_ray:$PYTHONPATH
R=/tmp/res_m; mkdir -p $R; nvidia-smi > $R/nvidia_smi.txt 2>&1
t0=$(date +%s)
python3 -c "from clip_flash.ops._extension import load_extension; print(load_extension())" > $R/build.log 2>&1
python3 -c "import ray; print('ray', ray.__version__)" > $R/ray_version.txt 2>&1
echo "build $(( $(date +%s) - t0 )) s" >> $R/times.txt
timeout 300 python3 -m pytest -v --durations=0 -o faulthandler_timeout=200 tests/jobs/test_job_ray_gpu.py tests/jobs/test_job_ray.py > $R/gpu_tests_ray.log 2>&1
echo "tests rc $? $(( $(date +%s) - t0 )) s" >> $R/times.txt
tar czf $OUT/res_m.tgz -C /tmp res_m
cat $R/times.txt $R/ray_version.txt; grep -E "PASS|FAIL|ERROR|passed|failed|skipped|Timeout" $R/gpu_tests_ray.log | tail -20
