#!/usr/bin/env bash
# At REV: the decode-gpu ViT-B-32 job over 57,600 files, exact share 0 (2 decoding threads) against 0.35 with 2, 3
# and 4 decoding threads, alternated twice.
rev=$1; R=/tmp/rk; mkdir -p $R; start=$(date +%s)
cp -r .device/photos384 /tmp/photos384
job() { # name share threads
  now=$(date +%s); if (( now - start > 520 )); then echo "skip $1 at $((now-start)) s"; return; fi
  timeout 80 python3 benchmarks/bench_embed.py --photos /tmp/photos384 --models ViT-B-32 --repeat 150 --cases gpu-decode --no-stock --captions 0 --encoder-calls 5 --exact-share $2 --decode-threads $3 --results $R/$1 > $R/$1.log 2>&1
  python3 - $R/$1 <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/embed_bench.json"))["rows"][0]["summary"]; m = s["main_thread_seconds"]
print(f"{sys.argv[1].split('/')[-1]:14s} steady {s['steady_items_per_s']:7.0f} run {s['items_per_s']:7.0f} after-load {s['after_load_items_per_s']:7.0f} setup {s['job_items_per_s']:7.0f} load {s['model_load_seconds']:.2f} warm {s['warm_up_seconds']:.2f} first {s['first_batch_seconds']:.2f} wait {m['waiting for inputs']:.2f} launch {m['launching']:.2f}")
PY
}
job share0_dt2_a 0 2; job share035_dt2_a 0.35 2; job share035_dt3_a 0.35 3; job share035_dt4_a 0.35 4
job share035_dt4_b 0.35 4; job share035_dt3_b 0.35 3; job share035_dt2_b 0.35 2; job share0_dt2_b 0 2
cd $R && tar -czf $OUT/call_k.tgz .
