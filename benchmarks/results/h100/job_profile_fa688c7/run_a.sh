# Device run A: the job's profile before/after the pinned-index fix, GPU tests, the job bench.
export SKIP_EXT_BUILD=1 CLIP_FLASH_CACHE=$PWD/build/cf_jit CLIP_FLASH_GIT_REVISION=$1
source .device/setup.sh
R=/tmp/res_a; mkdir -p $R
lscpu > $R/lscpu.txt 2>&1; rc=$?
t0=$(date +%s)
python3 -c "from clip_flash.ops._extension import load_extension; print(load_extension())" > $R/build.log 2>&1; rc=$?
echo "build $(( $(date +%s) - t0 )) s" >> $R/times.txt
cp clip_flash/inputs/images.py /tmp/fixed_images.py
cp .device/images_orig.py clip_flash/inputs/images.py
timeout 140 python3 scripts/profile_image_job.py --photos .device/photos --repeat 80 --bench-batches 40 --out $R/before > $R/before.log 2>&1; rc=$?
echo "before $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
cp /tmp/fixed_images.py clip_flash/inputs/images.py
timeout 140 python3 scripts/profile_image_job.py --photos .device/photos --repeat 80 --bench-batches 40 --out $R/after > $R/after.log 2>&1; rc=$?
echo "after $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
timeout 100 python3 -m pytest -q -x tests/inputs/test_images_gpu.py tests/inputs/test_jpeg_dct_gpu.py tests/jobs/test_job_gpu.py > $R/gpu_tests.log 2>&1; rc=$?
echo "tests $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
timeout 200 python3 scripts/bench_embed.py --photos .device/photos --results $R/embed --models ViT-B-32 --repeat 150 --captions 0 > $R/embed_log.txt 2>&1; rc=$?
echo "embed $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
tar czf $OUT/res_a.tgz -C /tmp res_a
