#!/usr/bin/env bash
# At REV: GPU tests of the job; then the server with ViT-B-32 --decode gpu, one JPEG a request (raw bytes), REV
# (new: resize queued by the decoding thread, size plans made once) against REV with d3558c1's image-input files
# (old), alternated old, new, new, old on fresh servers.
rev=$1; R=/tmp/ro; mkdir -p $R; start=$(date +%s)
timeout 90 python3 -m pytest -m gpu -q -rs tests/jobs/test_job_gpu.py > $R/gpu_tests_jobs_$rev.log 2>&1; echo "rc=$?" >> $R/gpu_tests_jobs_$rev.log; tail -2 $R/gpu_tests_jobs_$rev.log
echo "tests done at $(( $(date +%s) - start )) s"
cp -r .device/photos /tmp/photos
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=.device -cf - . | tar -xf - -C /tmp/old
cp -r .device/old/clip_flash /tmp/old/ && rm /tmp/old/clip_flash/inputs/image/thread_streams.py
grep -c "_resize_ahead" /tmp/old/clip_flash/inputs/image/preprocessor.py clip_flash/inputs/image/preprocessor.py
run() {  # tree name
  now=$(date +%s); if (( now - start > 300 )); then echo "skip $2 at $((now-start)) s"; return; fi
  ( cd $1 && PYTHONPATH=/tmp/site:$1 timeout 110 python3 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk --photos /tmp/photos --start-rps image-raw=5000 --factor 1.25 --refine 3 --duration 3 --server-args '' --results $R/$2 > $R/$2.log 2>&1 )
  grep -m1 "req/s (" $R/$2/serve_bench.md; echo "$2 at $(( $(date +%s) - start )) s"
  ( cd $R && tar -czf $OUT/call_o_$2.tgz $2 $2.log gpu_tests_jobs_$rev.log )
}
run /tmp/old old_a; run $PWD new_a; run $PWD new_b; run /tmp/old old_b
