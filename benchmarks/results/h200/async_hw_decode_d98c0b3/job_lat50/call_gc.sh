#!/usr/bin/env bash
# One H200 at NEW (exp/async-hw-decode) against OLD (main): the ViT-B-32 decode="gpu" job over 57,600 files
# new, old, new, old (needs .device/photos192: photo-set --count 192); ViT-L-14 at 50 req/s at OLD (main).
new=$1; old=$2; R=/tmp/rgc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_gc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; cp /tmp/build_ext.log $R/build_new.log 2>/dev/null
root=$PWD
( cd .old_tree && python3 setup.py -q build_ext --inplace > $R/build_old.log 2>&1 ); echo "old built at $(( $(date +%s) - start )) s"
rm -rf /tmp/photos192 && cp -r .device/photos192 /tmp/photos192
pack() { ( cd $R && tar -czf $OUT/call_gc.tgz . ); }
run() {  # name tree rev limit command...
  local name=$1 tree=$2 rev=$3 limit=$4; shift 4
  now=$(date +%s); if (( now - start + limit > 575 )); then echo "skip $name"; return; fi
  ( cd $tree && CLIP_FLASH_GIT_REVISION=$rev PYTHONPATH=/tmp/site:$tree timeout $limit python3 "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  echo "$name done at $(( $(date +%s) - start )) s"; pack
}
job() { run job_$1 $2 $3 80 benchmarks/bench_embed.py --photos /tmp/photos192 --models ViT-B-32 --repeat 300 --cases gpu-decode --no-stock --captions 0 --encoder-calls 10 --results $R/job_$1; grep -hE "^\| ViT" $R/job_$1/*.md | cut -d'|' -f4-12 | tr -s ' '; }
job new_a $root $new; job old_a $root/.old_tree $old; job new_b $root $new; job old_b $root/.old_tree $old
run lat50_old $root/.old_tree $old 110 benchmarks/serve/bench_serve.py --configs clip_flash --workloads image-raw --no-wrk --photos $root/.device/photos --rates 50 --duration 16 --results $R/lat50_old
grep -E "^\| *50\.0" $R/lat50_old/serve_bench.md | cut -d'|' -f2-12 | head -1
pack; echo "all done at $(( $(date +%s) - start )) s"
