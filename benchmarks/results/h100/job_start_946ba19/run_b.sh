# Device run B: light worker imports (fork server without OpenCLIP/torchvision): job profile, job bench, GPU tests, bench_clip.
export SKIP_EXT_BUILD=1 CLIP_FLASH_CACHE=$PWD/build/cf_jit CLIP_FLASH_GIT_REVISION=$1
source .device/setup.sh
R=/tmp/res_b; mkdir -p $R
t0=$(date +%s)
python3 -c "from clip_flash.ops._extension import load_extension; print(load_extension())" > $R/build.log 2>&1; rc=$?
echo "build $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
python3 -X importtime -c "import clip_flash.inputs.decode_pool" 2> $R/importtime_parent.txt; CLIP_FLASH_WORKER_PROCESS=1 python3 -X importtime -c "import clip_flash.inputs.decode_pool" 2> $R/importtime_worker.txt
echo "imports $(( $(date +%s) - t0 )) s" >> $R/times.txt
timeout 120 python3 scripts/profile_image_job.py --photos .device/photos --repeat 80 --bench-batches 40 --out $R/profile > $R/profile.log 2>&1; rc=$?
echo "profile $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
timeout 200 python3 scripts/bench_embed.py --photos .device/photos --results $R/embed --models ViT-B-32 --repeat 150 --captions 0 > $R/embed_log.txt 2>&1; rc=$?
echo "embed $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
timeout 100 python3 -m pytest -q tests/inputs/test_images_gpu.py tests/inputs/test_jpeg_dct_gpu.py tests/jobs/test_job_gpu.py tests/inputs/test_images_pool_start.py > $R/gpu_tests.log 2>&1; rc=$?
echo "tests $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
timeout 120 python3 scripts/bench_clip.py --model ViT-B-32 --images .device/photos --pipeline exact stock --no-tables --json $R/ViT-B-32-pipelines.json --markdown $R/ViT-B-32-pipelines.md > $R/bench_clip.log 2>&1; rc=$?
echo "bench_clip $(( $(date +%s) - t0 )) s rc $rc" >> $R/times.txt
tar czf $OUT/res_b.tgz -C /tmp res_b
