# Device run F: GPU tests after the in-caller hand-back (input code) and the job's image graphs.
export SKIP_EXT_BUILD=1 CLIP_FLASH_CACHE=$PWD/build/cf_jit CLIP_FLASH_GIT_REVISION=$1
source .device/setup.sh
R=/tmp/res_f; mkdir -p $R
t0=$(date +%s)
python3 -c "from clip_flash.ops._extension import load_extension; print(load_extension())" > $R/build.log 2>&1; rc=$?
echo "build $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
timeout 370 python3 -m pytest -v --durations=0 -o faulthandler_timeout=120 tests/inputs/test_images_gpu.py tests/inputs/test_images_handback.py tests/jobs/test_job_gpu.py tests/inputs/test_jpeg_dct_gpu.py tests/inputs/test_images_pool_start.py > $R/gpu_tests.log 2>&1; rc=$?
echo "tests $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
tar czf $OUT/res_f.tgz -C /tmp res_f
cat $R/times.txt; grep -E "FAIL|ERROR|passed|failed|Timeout|s call" $R/gpu_tests.log | head -30
