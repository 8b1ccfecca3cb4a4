#!/usr/bin/env bash
# At REV: GPU tests of the job and the server; then the decode-gpu ViT-B-32 job over 57,600 files (share 0), REV
# (new: nvJPEG's first calls made while the model loads) against REV with that switched off (old), alternated.
rev=$1; R=/tmp/rj; mkdir -p $R; start=$(date +%s)
timeout 150 python3 -m pytest -m gpu -q -rs tests/jobs/test_job_gpu.py tests/jobs/test_gpu_decoders_ahead.py > $R/gpu_tests_jobs_$rev.log 2>&1; echo "rc=$?" >> $R/gpu_tests_jobs_$rev.log; tail -3 $R/gpu_tests_jobs_$rev.log
timeout 170 python3 -m pytest -m gpu -q -rs tests/serve/test_serve_gpu.py > $R/gpu_tests_serve_$rev.log 2>&1; echo "rc=$?" >> $R/gpu_tests_serve_$rev.log; tail -3 $R/gpu_tests_serve_$rev.log
echo "tests done at $(( $(date +%s) - start )) s"
cp -r .device/photos384 /tmp/photos384
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=.device -cf - . | tar -xf - -C /tmp/old
sed -i 's/pipeline == "clip_flash" and decode == "gpu":/pipeline == "clip_flash" and decode == "off":/' /tmp/old/clip_flash/jobs/job.py
grep -c 'decode == "off"' /tmp/old/clip_flash/jobs/job.py || { echo "sed failed"; exit 1; }
job() { # tree name
  now=$(date +%s); if (( now - start > 540 )); then echo "skip $2 at $((now-start)) s"; return; fi
  ( cd $1 && PYTHONPATH=/tmp/site:$1 timeout 80 python3 benchmarks/bench_embed.py --photos /tmp/photos384 --models ViT-B-32 --repeat 150 --cases gpu-decode --no-stock --captions 0 --encoder-calls 5 --results $R/$2 > $R/$2.log 2>&1 )
  python3 - $R/$2 <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/embed_bench.json"))["rows"][0]["summary"]; m = s["main_thread_seconds"]
print(f"{sys.argv[1].split('/')[-1]:8s} steady {s['steady_items_per_s']:7.0f} run {s['items_per_s']:7.0f} after-load {s['after_load_items_per_s']:7.0f} load {s['model_load_seconds']:.2f} warm {s['warm_up_seconds']:.2f} first {s['first_batch_seconds']:.2f} wait {m['waiting for inputs']:.2f} launch {m['launching']:.2f}")
PY
}
job /tmp/old old_a; job $PWD new_a; job $PWD new_b; job /tmp/old old_b; job /tmp/old old_c; job $PWD new_c
cd $R && tar -czf $OUT/call_j.tgz .
