# Device run I: the hardware decoder taking batches from several threads at once (decoder states, per-thread
# streams): its GPU tests, then --decode gpu swept over decoding threads x decoders, alternated; then GPU tests.
export SKIP_EXT_BUILD=1 CLIP_FLASH_CACHE=$PWD/build/cf_jit CLIP_FLASH_GIT_REVISION=$1
source .device/setup.sh
R=/tmp/res_i; mkdir -p $R
lscpu > $R/lscpu.txt 2>&1; nvidia-smi > $R/nvidia_smi.txt 2>&1
t0=$(date +%s)
python3 -c "from clip_flash.ops._extension import load_extension; print(load_extension())" > $R/build.log 2>&1; rc=$?
echo "build $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
timeout 90 python3 -m pytest -v -o faulthandler_timeout=80 tests/inputs/test_nvjpeg_hardware_gpu.py > $R/gpu_tests_nvjpeg.log 2>&1
echo "nvjpeg tests rc $? $(( $(date +%s) - t0 )) s" >> $R/times.txt
tar czf $OUT/res_i.tgz -C /tmp res_i
job() {  # $1 label, $2 decode threads, $3 decoders, $4 extra args
  CLIP_FLASH_NVJPEG_DECODERS=$3 timeout 70 python3 scripts/embed.py --model ViT-B-32 --input .device/photos \
    --out /tmp/out_$1 --decode gpu --decode-threads $2 --repeat 150 --no-progress $4 > $R/embed_gpu_$1.log 2>&1
  echo "$1 rc $? $(( $(date +%s) - t0 )) s" >> $R/times.txt
  mkdir -p $R/record_$1; cp /tmp/out_$1/_clip_flash/runs/*.json $R/record_$1/ 2>/dev/null; rm -rf /tmp/out_$1
  tar czf $OUT/res_i.tgz -C /tmp res_i
}
job a_t2d1 2 1; job b_t4d4 4 4; job c_t2d2 2 2; job d_t4d1 4 1; job e_t3d3 3 3; job f_t4d4 4 4; job g_t2d1 2 1
job h_t6d4 6 4; job i_t4d4w8 4 4 "--workers 8"
left=$(( 530 - ($(date +%s) - t0) ))
timeout $left python3 -m pytest -v --durations=0 -o faulthandler_timeout=120 tests/jobs/test_job_gpu.py tests/inputs/test_images_gpu.py > $R/gpu_tests.log 2>&1
echo "tests rc $? $(( $(date +%s) - t0 )) s (limit $left)" >> $R/times.txt
tar czf $OUT/res_i.tgz -C /tmp res_i
cat $R/times.txt; grep -E "passed|failed" $R/gpu_tests_nvjpeg.log | tail -3
for f in $R/embed_gpu_*.log; do echo "$(basename $f): $(grep -o '[0-9,.]* items/s after the first shard' $f) | $(grep -o 'waiting for inputs [0-9.]* s' $f)"; done
grep -E "FAIL|ERROR|passed|failed|Timeout" $R/gpu_tests.log | tail -20
