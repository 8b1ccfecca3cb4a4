#!/usr/bin/env bash
# At REV (new: each image size planned once per process) against REV's parent (old: every batch's plan packs its
# tables again): the decode-gpu ViT-B-32 job over 57,600 files, exact share 0 and 0.35, alternated; GPU tests of
# the resize first.
rev=$1; R=/tmp/rm; mkdir -p $R; start=$(date +%s)
timeout 120 python3 -m pytest -m gpu -q -rs tests/inputs/test_image_resample_gpu.py tests/inputs/test_images_gpu.py > $R/gpu_tests_resample_$rev.log 2>&1; echo "rc=$?" >> $R/gpu_tests_resample_$rev.log; tail -2 $R/gpu_tests_resample_$rev.log
echo "tests done at $(( $(date +%s) - start )) s"
cp -r .device/photos384 /tmp/photos384
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=.device -cf - . | tar -xf - -C /tmp/old
cp .device/old/image_resample.py /tmp/old/clip_flash/ops/ && cp .device/old/resample_plan.py /tmp/old/clip_flash/inputs/image/
grep -c "_shape_plan" /tmp/old/clip_flash/ops/image_resample.py clip_flash/ops/image_resample.py
job() { # tree name share
  now=$(date +%s); if (( now - start > 530 )); then echo "skip $2 at $((now-start)) s"; return; fi
  ( cd $1 && PYTHONPATH=/tmp/site:$1 timeout 80 python3 benchmarks/bench_embed.py --photos /tmp/photos384 --models ViT-B-32 --repeat 150 --cases gpu-decode --no-stock --captions 0 --encoder-calls 5 --exact-share $3 --results $R/$2 > $R/$2.log 2>&1 )
  python3 - $R/$2 <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/embed_bench.json"))["rows"][0]["summary"]; m = s["main_thread_seconds"]
print(f"{sys.argv[1].split('/')[-1]:14s} steady {s['steady_items_per_s']:7.0f} run {s['items_per_s']:7.0f} after-load {s['after_load_items_per_s']:7.0f} setup {s['job_items_per_s']:7.0f} warm {s['warm_up_seconds']:.2f} first {s['first_batch_seconds']:.2f} wait {m['waiting for inputs']:.2f} launch {m['launching']:.2f}")
PY
}
job /tmp/old old_share0_a 0; job $PWD new_share0_a 0; job $PWD new_share035_a 0.35; job /tmp/old old_share035_a 0.35
job $PWD new_share035_b 0.35; job /tmp/old old_share035_b 0.35; job /tmp/old old_share0_b 0; job $PWD new_share0_b 0
cd $R && tar -czf $OUT/call_m.tgz .
