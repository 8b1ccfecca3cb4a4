#!/usr/bin/env bash
# On the two-GPU machine, at NEW (full sha) with OLD's tree in .old_tree (same csrc: the built extension is copied):
# Ray (carried stripped in .device_ray) made importable; the job's GPU tests and Ray's; the embedding job on one GPU
# against embed_with_ray on both (ViT-L-14 exact, 57,600 files: the 16 photos 3,600 times): new, old, new.
new=$1; old=$2; short=${new:0:7}; R=/tmp/rz; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_z.sh $R/
tar -xJf .device_ray/ray_stripped.tar.xz -C /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .device_ray/wheels/*.whl
python3 -c "import ray, ray.data; print('ray', ray.__version__)" 2>&1 | tail -n 2; nvidia-smi -L > $R/gpus.txt; nproc >> $R/gpus.txt
cp clip_flash/_C*.so .old_tree/clip_flash/
echo "ray ready at $(( $(date +%s) - start )) s"
CLIP_FLASH_GIT_REVISION=$new timeout 170 python3 -m pytest -q -rs -p no:cacheprovider tests/jobs/test_pinned_reserve_gpu.py tests/jobs/test_job_ray_gpu.py tests/jobs/test_job_gpu.py > $R/gpu_tests_jobs_$short.log 2>&1; echo "rc=$?" >> $R/gpu_tests_jobs_$short.log
tail -n 3 $R/gpu_tests_jobs_$short.log; echo "tests done at $(( $(date +%s) - start )) s"
( cd $R && tar -czf $OUT/call_z.tgz . )
bench() {  # name tree rev
  now=$(date +%s); if (( now - start > 470 )); then echo "skip $1"; return; fi
  ( cd $2 && CLIP_FLASH_GIT_REVISION=$3 PYTHONPATH=/tmp/site:$PWD timeout 150 python3 benchmarks/bench_embed_ray.py --photos $4/.device/photos --results $R/$1 --model ViT-L-14 --repeat 3600 > $R/$1.log 2>&1; echo "rc=$?" >> $R/$1.log )
  grep -E "^\| (clip|embed)|^- embed|^Rows" $R/$1/embed_ray.md; tail -n 2 $R/$1.log; echo "$1 done at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_z.tgz . )
}
root=$PWD
bench ray_new_a $root $new $root
bench ray_old_a $root/.old_tree $old $root
bench ray_new_b $root $new $root
