#!/usr/bin/env bash
# At REV: where the ViT-B-32 --decode gpu server's CPU goes at one JPEG a request under load: a fresh server at
# a fixed rate for 24 s with top snapshots (processes, the engine's threads) and py-spy (engine, one frontend);
# then one JPEG's latency through ImagePreprocessor + GraphedEncoder (ViT-L-14).
rev=$1; R=/tmp/rp; rm -rf $R; mkdir -p $R; start=$(date +%s)
pip install -q --no-index --no-deps --target /tmp/pyspy .device/diag/py_spy*.whl >/dev/null 2>&1
PYSPY=/tmp/pyspy/bin/py-spy
rm -rf /tmp/photos && cp -r .device/photos /tmp/photos
profile() { # name rate
  d=$R/$1; mkdir -p $d
  timeout 150 python3 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk --photos /tmp/photos --rates $2 --duration 20 --server-args '' --results $d > $d/bench.log 2>&1 &
  b=$!
  for i in $(seq 1 400); do grep -q "ready after" $d/bench.log 2>/dev/null && break; sleep 0.25; done
  echo "ready seen at $(( $(date +%s) - start )) s"; sleep 5
  e=$(pgrep -f "m clip_flash.serve" | head -1)
  f=$(pgrep -f "multiprocessing.spawn" | head -1)
  top -b -n 4 -d 2 -w 300 -c > $d/top_processes.txt 2>&1 &
  top -b -H -n 3 -d 2 -w 200 -p $e > $d/top_engine_threads.txt 2>&1 &
  $PYSPY record --pid $e --duration 8 --rate 250 --threads --nonblocking --format raw -o $d/pyspy_engine.txt > $d/pyspy_engine.log 2>&1 &
  $PYSPY record --pid $f --duration 8 --rate 250 --threads --nonblocking --format raw -o $d/pyspy_frontend.txt > $d/pyspy_frontend.log 2>&1 &
  ps -eo pid,ppid,nlwp,args --sort=pid | grep -E "python|clip" | grep -v grep > $d/ps.txt
  wait $b
  grep -E "^\|" $d/serve_bench.md | head -8
  echo "$1 done at $(( $(date +%s) - start )) s"
}
profile rate6500 6500
( cd $R && tar -czf $OUT/call_p_serve.tgz . )
