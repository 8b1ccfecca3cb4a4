# Device run D: the job with image CUDA graphs (8af2b4f) vs eager, alternated; ViT-L-14 too; GPU tests verbose.
export SKIP_EXT_BUILD=1 CLIP_FLASH_CACHE=$PWD/build/cf_jit CLIP_FLASH_GIT_REVISION=$1
source .device/setup.sh
R=/tmp/res_d; mkdir -p $R
lscpu > $R/lscpu.txt 2>&1
t0=$(date +%s)
python3 -c "from clip_flash.ops._extension import load_extension; print(load_extension())" > $R/build.log 2>&1; rc=$?
echo "build $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
timeout 270 python3 scripts/bench_embed.py --photos .device/photos --results $R/embed --models ViT-B-32 ViT-L-14 --repeat 150 20 --captions 0 --cases exact-processes-eager exact-processes exact-processes-eager exact-processes gpu-decode > $R/embed_log.txt 2>&1; rc=$?
echo "embed $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
tar czf $OUT/res_d.tgz -C /tmp res_d
timeout 230 python3 -m pytest -v --durations=0 -o faulthandler_timeout=100 tests/jobs/test_job_gpu.py tests/inputs/test_images_pool_start.py tests/inputs/test_jpeg_dct_gpu.py tests/inputs/test_images_gpu.py > $R/gpu_tests.log 2>&1; rc=$?
echo "tests $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
tar czf $OUT/res_d.tgz -C /tmp res_d
cat $R/times.txt; grep -E "^\| ViT" $R/embed/embed_bench.md | cut -c1-200; grep -E "PASS|FAIL|ERROR|passed|failed|Timeout" $R/gpu_tests.log | tail -60
