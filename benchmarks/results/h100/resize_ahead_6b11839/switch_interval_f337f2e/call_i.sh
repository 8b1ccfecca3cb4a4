#!/usr/bin/env bash
# At REV: the hardware-route GPU tests; then the decode-gpu ViT-B-32 job over 57,600 files at the interpreter's
# default switch interval (5 ms) and at 0.5 ms, exact share 0 and 0.35, alternated; one run under py-spy.
rev=$1; R=/tmp/ri; mkdir -p $R; start=$(date +%s)
timeout 100 python3 -m pytest -m gpu -q -rs tests/inputs/test_nvjpeg_hardware_gpu.py > $R/gpu_tests_nvjpeg_$rev.log 2>&1; echo "rc=$?" >> $R/gpu_tests_nvjpeg_$rev.log; tail -3 $R/gpu_tests_nvjpeg_$rev.log
echo "tests done at $(( $(date +%s) - start )) s"
pip install -q --no-index --no-deps --target /tmp/pyspy .device/diag/py_spy*.whl >/dev/null 2>&1
cp -r .device/photos384 /tmp/photos384
ARGS="--photos /tmp/photos384 --models ViT-B-32 --repeat 150 --cases gpu-decode --no-stock --captions 0 --encoder-calls 5"
job() { # name switch-interval share
  now=$(date +%s); if (( now - start > 520 )); then echo "skip $1 at $((now-start)) s"; return; fi
  timeout 80 python3 .device/run_si.py $2 benchmarks/bench_embed.py $ARGS --exact-share $3 --results $R/$1 > $R/$1.log 2>&1
  python3 - $R/$1 <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/embed_bench.json"))["rows"][0]["summary"]; m = s["main_thread_seconds"]
print(f"{sys.argv[1].split('/')[-1]:14s} steady {s['steady_items_per_s']:7.0f} run {s['items_per_s']:7.0f} wait {m['waiting for inputs']:.2f} launch {m['launching']:.2f} first {s['first_batch_seconds']:.2f}")
PY
}
job si5ms_share0_a 0.005 0; job si05ms_share0_a 0.0005 0; job si05ms_share035_a 0.0005 0.35; job si5ms_share035_a 0.005 0.35
job si5ms_share035_b 0.005 0.35; job si05ms_share035_b 0.0005 0.35; job si05ms_share0_b 0.0005 0; job si5ms_share0_b 0.005 0
echo "profile at $(( $(date +%s) - start )) s"
timeout 90 /tmp/pyspy/bin/py-spy record --threads --idle --rate 200 --format raw -o $R/pyspy_share0.txt -- python3 benchmarks/bench_embed.py $ARGS --exact-share 0 --results $R/pyspy_share0 > $R/pyspy_share0.log 2>&1
echo "done at $(( $(date +%s) - start )) s"
cd $R && tar -czf $OUT/call_i.tgz .
