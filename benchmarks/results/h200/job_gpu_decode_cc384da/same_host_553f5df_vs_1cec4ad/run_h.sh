# Device run H: GPU tests at HEAD (d883d0d/553f5df never ran on a GPU); --decode gpu at HEAD alternated with
# 1cec4ad (14,213 img/s there on another host) on one host, by the same command; HEAD's gpu-decode profile.
export SKIP_EXT_BUILD=1 CLIP_FLASH_GIT_REVISION=$1
source .device/setup.sh
ROOT=$PWD; OLD=$ROOT/.device/old_1cec4ad
R=/tmp/res_h; mkdir -p $R
lscpu > $R/lscpu.txt 2>&1; nvidia-smi > $R/nvidia_smi.txt 2>&1
t0=$(date +%s)
CLIP_FLASH_CACHE=$ROOT/build/cf_jit python3 -c "from clip_flash.ops._extension import load_extension; print(load_extension())" > $R/build.log 2>&1; rc=$?
(cd $OLD && CLIP_FLASH_CACHE=$OLD/build/cf_jit PYTHONPATH=/tmp/site:$OLD python3 -c "from clip_flash.ops._extension import load_extension; print(load_extension())") > $R/build_old.log 2>&1; rc2=$?
echo "builds $(( $(date +%s) - t0 )) s rc $rc $rc2" >> $R/times.txt
job() {  # $1 label, $2 tree, $3 revision
  (cd $2 && CLIP_FLASH_GIT_REVISION=$3 CLIP_FLASH_CACHE=$2/build/cf_jit PYTHONPATH=/tmp/site:$2 timeout 90 \
     python3 scripts/embed.py --model ViT-B-32 --input $ROOT/.device/photos --out /tmp/out_$1 --decode gpu \
       --repeat 150 --no-progress) > $R/embed_gpu_$1.log 2>&1
  echo "$1 rc $? $(( $(date +%s) - t0 )) s" >> $R/times.txt
  cp /tmp/out_$1/*.json $R/ 2>/dev/null; mkdir -p $R/record_$1; cp /tmp/out_$1/*.json $R/record_$1/ 2>/dev/null; rm -rf /tmp/out_$1
  tar czf $OUT/res_h.tgz -C /tmp res_h
}
job head1 $ROOT $1; job old1 $OLD 1cec4ad; job head2 $ROOT $1; job old2 $OLD 1cec4ad; job head3 $ROOT $1; job old3 $OLD 1cec4ad
CLIP_FLASH_CACHE=$ROOT/build/cf_jit timeout 100 python3 scripts/profile_image_job.py --photos .device/photos --decode gpu --repeat 80 --no-bench --out $R/profile_gpu > $R/profile_gpu.log 2>&1
echo "profile rc $? $(( $(date +%s) - t0 )) s" >> $R/times.txt
tar czf $OUT/res_h.tgz -C /tmp res_h
left=$(( 560 - ($(date +%s) - t0) ))
CLIP_FLASH_CACHE=$ROOT/build/cf_jit timeout $left python3 -m pytest -v --durations=0 -o faulthandler_timeout=120 tests/inputs/test_images_handback.py tests/jobs/test_job_gpu.py tests/inputs/test_jpeg_dct_gpu.py tests/inputs/test_images_pool_start.py tests/inputs/test_images_gpu.py > $R/gpu_tests.log 2>&1
echo "tests rc $? $(( $(date +%s) - t0 )) s (limit $left)" >> $R/times.txt
tar czf $OUT/res_h.tgz -C /tmp res_h
cat $R/times.txt; grep -h "items/s" $R/embed_gpu_*.log | cut -c1-250; grep -E "FAIL|ERROR|passed|failed|Timeout" $R/gpu_tests.log | tail -30
