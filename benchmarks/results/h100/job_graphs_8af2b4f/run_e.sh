# Device run E: test_images_gpu.py alone with per-test durations (run C/D timed out in it), then the job profile with graphs.
export SKIP_EXT_BUILD=1 CLIP_FLASH_CACHE=$PWD/build/cf_jit CLIP_FLASH_GIT_REVISION=$1
source .device/setup.sh
R=/tmp/res_e; mkdir -p $R
t0=$(date +%s)
python3 -c "from clip_flash.ops._extension import load_extension; print(load_extension())" > $R/build.log 2>&1; rc=$?
echo "build $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
timeout 290 python3 -m pytest -v --durations=0 -o faulthandler_timeout=150 tests/inputs/test_images_gpu.py > $R/gpu_tests_images.log 2>&1; rc=$?
echo "tests $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
tar czf $OUT/res_e.tgz -C /tmp res_e
timeout 100 python3 scripts/profile_image_job.py --photos .device/photos --repeat 80 --bench-batches 40 --out $R/profile > $R/profile.log 2>&1; rc=$?
echo "profile $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
tar czf $OUT/res_e.tgz -C /tmp res_e
cat $R/times.txt; grep -E "PASS|FAIL|ERROR|passed|failed|Timeout|s call" $R/gpu_tests_images.log | tail -45; sed -n 1,16p $R/profile/job_profile.txt; grep BENCH $R/profile/job_profile.txt
