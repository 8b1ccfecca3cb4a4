# Device run J (final): the job bench at the session's last code (stock, exact, --decode gpu, alternated), the
# GPU tests after the decoder-state and decoding-pool changes, then the hardware route's concurrency probe.
export SKIP_EXT_BUILD=1 CLIP_FLASH_CACHE=$PWD/build/cf_jit CLIP_FLASH_GIT_REVISION=$1
source .device/setup.sh
R=/tmp/res_j; mkdir -p $R
lscpu > $R/lscpu.txt 2>&1; nvidia-smi > $R/nvidia_smi.txt 2>&1
t0=$(date +%s)
python3 -c "from clip_flash.ops._extension import load_extension; print(load_extension())" > $R/build.log 2>&1; rc=$?
echo "build $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
timeout 210 python3 scripts/bench_embed.py --photos .device/photos --results $R/embed --models ViT-B-32 --repeat 150 --captions 0 --cases exact-processes gpu-decode exact-processes gpu-decode > $R/embed_log.txt 2>&1
echo "embed rc $? $(( $(date +%s) - t0 )) s" >> $R/times.txt
tar czf $OUT/res_j.tgz -C /tmp res_j
left=$(( 480 - ($(date +%s) - t0) ))
timeout $left python3 -m pytest -v --durations=0 -o faulthandler_timeout=120 tests/inputs/test_nvjpeg_hardware_gpu.py tests/inputs/test_images_handback.py tests/jobs/test_job_gpu.py tests/inputs/test_jpeg_dct_gpu.py tests/inputs/test_images_pool_start.py tests/inputs/test_images_gpu.py tests/inputs/test_image_resample_gpu.py > $R/gpu_tests.log 2>&1
echo "tests rc $? $(( $(date +%s) - t0 )) s (limit $left)" >> $R/times.txt
tar czf $OUT/res_j.tgz -C /tmp res_j
left=$(( 545 - ($(date +%s) - t0) ))
[ $left -gt 20 ] && timeout $left python3 scripts/probe_nvjpeg_concurrency.py --photos .device/photos --threads 1 2 4 --rounds 3 --json $R/nvjpeg_concurrency.json > $R/nvjpeg_concurrency.txt 2>&1
echo "probe rc $? $(( $(date +%s) - t0 )) s" >> $R/times.txt
tar czf $OUT/res_j.tgz -C /tmp res_j
cat $R/times.txt; grep -E "^\| ViT" $R/embed/embed_bench.md | cut -c1-160; grep -E "FAIL|ERROR|passed|failed|Timeout" $R/gpu_tests.log | tail -20; cat $R/nvjpeg_concurrency.txt | tail -8
