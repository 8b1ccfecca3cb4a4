#!/usr/bin/env bash
# One H200: the ViT-B-32 --decode gpu server at one JPEG a request, FrameProtocol (NEW) against the StreamReader
# (OLD = c66cc2a), fresh servers new, old, new; then NEW at 7,000 req/s for 20 s under py-spy (the engine: samples
# of threads on a core, and of the thread holding the GIL); then ViT-L-14 at 50 req/s, old and new.
new=$1; old=$2; R=/tmp/reb; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_eb.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
( cd .old_tree && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1 ); echo "old built at $(( $(date +%s) - start )) s"
pack() { ( cd $R && tar -czf $OUT/call_eb.tgz . ); }
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
b32() { run b32_$1 $2 $3 100 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk --photos $root/.device/photos --rates 6000,7000,8000,9000 --duration 3 --results $R/b32_$1; grep -E "^\| *[6-9],000" $R/b32_$1/serve_bench.md | cut -d'|' -f2-12 | head -4; grep -E "mean batch" $R/b32_$1/serve_bench.md | head -1; }
b32 new_a $root $new; b32 old_a $root/.old_tree $old; b32 new_b $root $new
profile() { # name rate
  d=$R/$1; mkdir -p $d
  now=$(date +%s); if (( now - start + 90 > 575 )); then echo "skip $1"; return; fi
  CLIP_FLASH_GIT_REVISION=$new timeout 90 python3 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk --photos $root/.device/photos --rates $2 --duration 20 --results $d > $d/bench.log 2>&1 &
  b=$!
  for i in $(seq 1 400); do grep -q "ready after" $d/bench.log 2>/dev/null && break; sleep 0.25; done
  sleep 6
  e=$(pgrep -f "m clip_flash.serve" | head -1)
  top -b -n 3 -d 2 -w 300 -c > $d/top_processes.txt 2>&1 &
  top -b -H -n 3 -d 2 -w 200 -p $e > $d/top_engine_threads.txt 2>&1 &
  py-spy record --pid $e --duration 8 --rate 250 --threads --nonblocking --format raw -o $d/pyspy_engine_busy.txt > $d/pyspy_busy.log 2>&1 &
  py-spy record --pid $e --duration 8 --rate 250 --threads --gil --nonblocking --format raw -o $d/pyspy_engine_gil.txt > $d/pyspy_gil.log 2>&1 &
  wait $b
  grep -E "^\| *[0-9],[0-9]00" $d/serve_bench.md | cut -d'|' -f2-12 | head -2
  echo "$1 done at $(( $(date +%s) - start )) s"; pack
}
profile profile_7000 7000
lat() { run lat50_$1 $2 $3 110 benchmarks/serve/bench_serve.py --configs clip_flash --workloads image-raw --no-wrk --photos $root/.device/photos --rates 50 --duration 16 --results $R/lat50_$1; grep -E "^\| *50\.0" $R/lat50_$1/serve_bench.md | cut -d'|' -f2-12 | head -1; }
lat new_a $root $new; lat old_a $root/.old_tree $old
pack; echo "all done at $(( $(date +%s) - start )) s"
