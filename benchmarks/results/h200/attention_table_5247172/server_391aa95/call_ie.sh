#!/usr/bin/env bash
# One H200 at NEW: the ViT-B-32 --decode gpu server, one JPEG a request, with the H200 attention table and then
# without it (the file moved away), fresh servers.
new=$1; R=/tmp/rie; rm -rf $R; mkdir -p $R; start=$(date +%s)
cp .device/call_ie.sh $R/; nvidia-smi -L > $R/gpu.txt; nproc >> $R/gpu.txt
T=clip_flash/backends/attention_tables/nvidia-h200.json
export CLIP_FLASH_GIT_REVISION=$new
pack() { ( cd $R && tar -czf $OUT/call_ie.tgz . ); }
srv() {  # side
  now=$(date +%s); if (( now - start + 95 > 200 )); then echo "skip $1"; return; fi
  [ $1 = none ] && mv $T /tmp/h200_table.json
  (timeout 95 python3 benchmarks/serve/bench_serve.py --configs clip_flash-small-gpu --workloads image-raw --no-wrk \
      --photos .device/photos --rates 7000,8000,9000 --duration 3 --results $R/b32_$1 > $R/b32_$1.log 2>&1; echo rc=$? >> $R/b32_$1.log)
  [ $1 = none ] && mv /tmp/h200_table.json $T
  grep -E "^\| *[0-9]+,000" $R/b32_$1/serve_bench.md | cut -d'|' -f2-12 | head -3; echo "$1 done at $(( $(date +%s) - start )) s"; pack
}
srv table; srv none
pack
