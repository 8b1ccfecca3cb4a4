#!/usr/bin/env bash
# At REV: GPU tests of the image inputs (resize, exact and fast paths, hardware route, lifetimes); then the exact
# ViT-B-32 job (decode cpu, native) over 7,680 files, REV against REV with the plan code of 4a3b39b (old: every
# batch's plan packs its tables again), alternated.
rev=$1; R=/tmp/rn; mkdir -p $R; start=$(date +%s)
timeout 330 python3 -m pytest -m gpu -q -rs tests/inputs/test_image_resample_gpu.py tests/inputs/test_images_gpu.py tests/inputs/test_nvjpeg_hardware_gpu.py tests/inputs/test_images_lifetime_gpu.py tests/inputs/test_jpeg_dct_gpu.py > $R/gpu_tests_inputs_$rev.log 2>&1; echo "rc=$?" >> $R/gpu_tests_inputs_$rev.log; tail -3 $R/gpu_tests_inputs_$rev.log
echo "tests done at $(( $(date +%s) - start )) s"
cp -r .device/photos384 /tmp/photos384
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=.device -cf - . | tar -xf - -C /tmp/old
cp .device/old/image_resample.py /tmp/old/clip_flash/ops/ && cp .device/old/resample_plan.py /tmp/old/clip_flash/inputs/image/
job() { # tree name
  now=$(date +%s); if (( now - start > 540 )); then echo "skip $2 at $((now-start)) s"; return; fi
  ( cd $1 && PYTHONPATH=/tmp/site:$1 timeout 70 python3 benchmarks/bench_embed.py --photos /tmp/photos384 --models ViT-B-32 --repeat 20 --cases exact-native --no-stock --captions 0 --encoder-calls 5 --results $R/$2 > $R/$2.log 2>&1 )
  python3 - $R/$2 <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/embed_bench.json"))["rows"][0]["summary"]; m = s["main_thread_seconds"]
print(f"{sys.argv[1].split('/')[-1]:10s} steady {s['steady_items_per_s']:7.0f} run {s['items_per_s']:7.0f} after-load {s['after_load_items_per_s']:7.0f} setup {s['job_items_per_s']:7.0f} warm {s['warm_up_seconds']:.2f} first {s['first_batch_seconds']:.2f} wait {m['waiting for inputs']:.2f} launch {m['launching']:.2f}")
PY
}
job /tmp/old exact_old_a; job $PWD exact_new_a; job $PWD exact_new_b; job /tmp/old exact_old_b
cd $R && tar -czf $OUT/call_n.tgz .
