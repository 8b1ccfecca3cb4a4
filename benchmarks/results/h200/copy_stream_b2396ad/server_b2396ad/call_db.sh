#!/usr/bin/env bash
# One H200: NEW (the embeddings' copy to the host on a stream of its own) against OLD (the copy on the launching
# stream), each tree with its own extension. The server's GPU tests at NEW; the server at 64 captions a request,
# fresh servers NEW, OLD, NEW, then NEW with --max-batches-in-flight 3 while time is left.
new=$1; old=$2; R=/tmp/rdb; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_db.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
( cd .old_tree && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1; echo "rc=$?" >> $R/build_old.log ) &
b1=$!
pack() { ( cd $R && tar -czf $OUT/call_db.tgz . ); }
CLIP_FLASH_GIT_REVISION=$new timeout 150 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/serve/test_serve_gpu.py > $R/gpu_tests_serve_$new.log 2>&1
tail -n 3 $R/gpu_tests_serve_$new.log; grep -E "FAILED|ERROR" $R/gpu_tests_serve_$new.log | head; echo "tests done at $(( $(date +%s) - start )) s"; pack
wait $b1; tail -n 1 $R/build_old.log
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 590 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
serve() { run serve_$1 $2 $3 115 benchmarks/serve/bench_serve.py --configs clip_flash --workloads captions64 --no-wrk --photos $root/.device/photos --rates 1500,1580,1660,1740 --duration 8 --results $R/serve_$1 "${@:4}"; grep -E "^\| *1,[5-7][0-9]0" $R/serve_$1/serve_bench.md | cut -d'|' -f2-9 | head -4; grep -iE "ready after" $R/serve_$1/serve_bench.md | head -1 | cut -c1-240; grep -E "mean batch" $R/serve_$1/serve_bench.md | head -2; }
serve new_a $root $new; serve old_a $root/.old_tree $old; serve new_b $root $new
serve inflight3_a $root $new "--server-args=--max-batches-in-flight 3"
pack; echo "all done at $(( $(date +%s) - start )) s"
