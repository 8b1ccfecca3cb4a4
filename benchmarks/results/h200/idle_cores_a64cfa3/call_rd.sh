#!/usr/bin/env bash
# One H200 at REV (literal full hash): one JPEG a request (ViT-L-14), untraced, at 50, 200, 400 and 800 req/s, the
# early launch off (--no-early-launch) and on (the default) alternated usual, early, usual, early: whether the
# default should stay on.
rev=$1; R=/tmp/rrd; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_rd.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_rd.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 390 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  grep "image-raw: offered" $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
for side in usual_a early_a usual_b early_b; do
  extra=(); [[ $side == usual* ]] && extra=(--server-args=--no-early-launch)
  run bench_$side 100 python3 benchmarks/serve/bench_serve.py --results $R/bench_$side --configs clip_flash \
      --workloads image-raw --no-wrk --photos .device/photos --rates 50,200,400,800 --duration 8 "${extra[@]}"
done
pack; echo "all done at $(( $(date +%s) - start )) s"
