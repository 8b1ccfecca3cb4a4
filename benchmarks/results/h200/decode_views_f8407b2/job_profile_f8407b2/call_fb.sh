#!/usr/bin/env bash
# One H200 at REV (HEAD: encoded views): the GPU tests owed (image lifetimes, serve, job); the ViT-B-32 decode="gpu" job
# over 57,600 files twice; the ViT-B-32 --decode gpu server at 8,000 req/s for 20 s under py-spy (busy and --gil).
rev=$1; R=/tmp/rfb; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_fb.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD; export CLIP_FLASH_GIT_REVISION=$rev
rm -rf /tmp/photos192 && cp -r .device/photos192 /tmp/photos192
pack() { ( cd $R && tar -czf $OUT/call_fb.tgz . ); }
timeout 230 python3 -m pytest -q -rs -p no:cacheprovider tests/inputs/test_images_lifetime_gpu.py tests/serve/test_serve_gpu.py tests/jobs/test_job_gpu.py tests/jobs/test_gpu_decoders_ahead.py tests/jobs/test_pinned_reserve_gpu.py > $R/gpu_tests_$rev.log 2>&1; echo "rc=$?" >> $R/gpu_tests_$rev.log
tail -n 3 $R/gpu_tests_$rev.log; grep -E "FAILED|ERROR" $R/gpu_tests_$rev.log | head -5
echo "tests done at $(( $(date +%s) - start )) s"; pack
job() {  # name
  now=$(date +%s); if (( now - start + 80 > 575 )); then echo "skip $1"; return; fi
  timeout 80 python3 benchmarks/bench_embed.py --photos /tmp/photos192 --models ViT-B-32 --repeat 300 --cases gpu-decode --no-stock --captions 0 --encoder-calls 10 --results $R/$1 > $R/$1.log 2>&1; echo "rc=$?" >> $R/$1.log
  grep -hE "^\| ViT" $R/$1/*.md | cut -d'|' -f4-14 | tr -s ' '; echo "$1 done at $(( $(date +%s) - start )) s"; pack
}
job job_gpu_b32_a; job job_gpu_b32_b
profile() { # name rate
  d=$R/$1; mkdir -p $d
  now=$(date +%s); if (( now - start + 90 > 575 )); then echo "skip $1"; return; fi
  timeout 90 python3 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk --photos $root/.device/photos --rates $2 --duration 20 --results $d > $d/bench.log 2>&1 &
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
profile profile_8000 8000
pack; echo "all done at $(( $(date +%s) - start )) s"
