#!/usr/bin/env bash
# One H200 at NEW (main) against OLD (57ef1c8, the last committed ViT-L-14 50 req/s run): one JPEG a request at
# 50 req/s new, old, new, old; then 64 captions a request new, old.
new=$1; old=$2; R=/tmp/rgd; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_gd.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
( cd .old_tree && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1 ); echo "old built at $(( $(date +%s) - start )) s"
pack() { ( cd $R && tar -czf $OUT/call_gd.tgz . ); }
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
lat() { run lat50_$1 $2 $3 100 benchmarks/serve/bench_serve.py --configs clip_flash --workloads image-raw --no-wrk --photos $root/.device/photos --rates 50 --duration 16 --results $R/lat50_$1; grep -E "^\| *50\.0" $R/lat50_$1/serve_bench.md | cut -d'|' -f2-12; }
cap() { run captions64_$1 $2 $3 115 benchmarks/serve/bench_serve.py --configs clip_flash --workloads captions64 --no-wrk --photos $root/.device/photos --rates 1500,1560,1620 --duration 8 --results $R/captions64_$1; grep -E "^\| *1,[5-7][0-9]0\.0 \| [0-9]" $R/captions64_$1/serve_bench.md | cut -d'|' -f2-12; }
lat new_a $root $new; lat old_a $root/.old_tree $old; lat new_b $root $new; lat old_b $root/.old_tree $old
cap new $root $new; cap old $root/.old_tree $old
pack; echo "all done at $(( $(date +%s) - start )) s"
