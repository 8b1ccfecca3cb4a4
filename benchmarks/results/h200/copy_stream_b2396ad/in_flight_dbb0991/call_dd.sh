#!/usr/bin/env bash
# One H200 at NEW (b2396ad: the embeddings' copy on a stream of its own): the server at 64 captions a request with
# --max-batches-in-flight 3 against the default 2, fresh servers 3, 2.
new=$1; R=/tmp/rdd; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_dd.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
pack() { ( cd $R && tar -czf $OUT/call_dd.tgz . ); }
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 340 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
serve() { run serve_$1 $root $new 120 benchmarks/serve/bench_serve.py --configs clip_flash --workloads captions64 --no-wrk --photos $root/.device/photos --rates 1500,1560,1620,1700 --duration 8 --results $R/serve_$1 "${@:2}"; grep -E "^\| *1,[5-7][0-9]0" $R/serve_$1/serve_bench.md | cut -d'|' -f2-9 | head -4; grep -iE "ready after" $R/serve_$1/serve_bench.md | head -1 | cut -c1-240; grep -E "mean batch" $R/serve_$1/serve_bench.md | head -2; }
serve inflight3_a "--server-args=--max-batches-in-flight 3"; serve inflight2_a
pack; echo "all done at $(( $(date +%s) - start )) s"
