#!/usr/bin/env bash
# One H200 at REV (literal full hash): one JPEG a request (ViT-L-14) at 50 and 400 req/s, untraced, with the host's
# cores left to idle and kept awake (benchmarks/serve/keep_awake.py: a SCHED_IDLE spinner per core, and a 0 us
# /dev/cpu_dma_latency request where allowed), alternated plain, awake, plain, awake.
rev=$1; R=/tmp/rrc; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_rc.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt; id >> $R/gpu.txt
export CLIP_FLASH_GIT_REVISION=$rev
pack() { ( cd $R && tar -czf $OUT/call_rc.tgz . ); }
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  now=$(date +%s); if (( now - start + limit > 585 )); then echo "skip $name"; return; fi
  ( timeout $limit "$@" > $R/$name.log 2>&1; echo "rc=$?" >> $R/$name.log )
  grep "image-raw: offered" $R/$name.log; echo "$name done at $(( $(date +%s) - start )) s"; pack
}
for side in plain_a awake_a plain_b awake_b; do
  if [[ $side == awake* ]]; then
    python3 benchmarks/serve/keep_awake.py --processes 16 --seconds 140 --dma-latency > $R/keep_awake_$side.log 2>&1 &
    awake=$!; sleep 1
  fi
  run bench_$side 130 python3 benchmarks/serve/bench_serve.py --results $R/bench_$side --configs clip_flash \
      --workloads image-raw --no-wrk --photos .device/photos --rates 50,400 --duration 12
  if [[ $side == awake* ]]; then kill $awake; wait $awake; fi
done
pack; echo "all done at $(( $(date +%s) - start )) s"
