# Device run C (eighth session): GPU tests of everything since 946ba19, the job bench, the job profile.
export SKIP_EXT_BUILD=1 CLIP_FLASH_CACHE=$PWD/build/cf_jit CLIP_FLASH_GIT_REVISION=$1
source .device/setup.sh
R=/tmp/res_c; mkdir -p $R
lscpu > $R/lscpu.txt 2>&1; nproc >> $R/lscpu.txt
t0=$(date +%s)
python3 -c "from clip_flash.ops._extension import load_extension; print(load_extension())" > $R/build.log 2>&1; rc=$?
echo "build $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
timeout 200 python3 scripts/bench_embed.py --photos .device/photos --results $R/embed --models ViT-B-32 --repeat 150 --captions 0 > $R/embed_log.txt 2>&1; rc=$?
echo "embed $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
tar czf $OUT/res_c.tgz -C /tmp res_c
timeout 190 python3 -m pytest -q tests/inputs/test_images_gpu.py tests/inputs/test_jpeg_dct_gpu.py tests/jobs/test_job_gpu.py tests/inputs/test_images_pool_start.py > $R/gpu_tests.log 2>&1; rc=$?
echo "tests $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
tar czf $OUT/res_c.tgz -C /tmp res_c
timeout 110 python3 scripts/profile_image_job.py --photos .device/photos --repeat 80 --bench-batches 40 --out $R/profile > $R/profile.log 2>&1; rc=$?
echo "profile $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
tar czf $OUT/res_c.tgz -C /tmp res_c
cat $R/times.txt; tail -8 $R/embed/embed_bench.md; tail -3 $R/gpu_tests.log
