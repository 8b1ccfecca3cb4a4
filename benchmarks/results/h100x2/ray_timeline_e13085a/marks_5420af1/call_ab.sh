#!/usr/bin/env bash
# On the two-GPU machine, at REV (full sha): Ray (carried stripped in .device_ray) made importable; the embedding job
# on one GPU against embed_with_ray on both (ViT-L-14 exact, 57,600 files: the 16 photos 3,600 times), once.
rev=$1; R=/tmp/rab; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ab.sh $R/
tar -xJf .device_ray/ray_stripped.tar.xz -C /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .device_ray/wheels/*.whl
nvidia-smi -L > $R/gpus.txt; nproc >> $R/gpus.txt; echo "ray ready at $(( $(date +%s) - start )) s"
CLIP_FLASH_GIT_REVISION=$rev timeout 170 python3 benchmarks/bench_embed_ray.py --photos .device/photos --results $R/ray_c --model ViT-L-14 --repeat 3600 > $R/ray_c.log 2>&1; echo "rc=$?" >> $R/ray_c.log
grep -E "^\| (clip|embed)|^- embed|^Rows" $R/ray_c/embed_ray.md; tail -n 2 $R/ray_c.log; echo "done at $(( $(date +%s) - start )) s"
( cd $R && tar -czf $OUT/call_ab.tgz . )
